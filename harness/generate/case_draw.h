// One drawn case (`gradscope sample`, catalog/case_sampler.cpp): its random choices from a
// seeded stream of its own, written as case-file text so that the case file loader validates
// a drawn case as it does a written one. Each kind draws its own fields (KindDecl::sample).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "harness/generate/seeded_streams.h"

namespace gradscope {

class CaseDraw {
 public:
  CaseDraw(uint64_t seed, std::string stream);

  // Choices: each call takes the stream's next element.
  double uniform();
  bool chance(double p) { return uniform() < p; }
  template <class T>
  const T& pick(const std::vector<T>& options) {
    return options[std::min(options.size() - 1, static_cast<size_t>(uniform() * options.size()))];
  }
  int64_t between(int64_t lo, int64_t hi);  // inclusive
  // Choices from a stream of their own, so that adding them leaves every draw of this stream
  // what it was. Its fields go into this case's text.
  CaseDraw substream(const std::string& name);

  // Fields, one key per line.
  void set(const std::string& key, const std::string& value);
  void set(const std::string& key, const char* value) { set(key, std::string(value)); }
  void set(const std::string& key, int64_t value);
  void set(const std::string& key, int value) { set(key, static_cast<int64_t>(value)); }
  void set(const std::string& key, bool value);
  void set(const std::string& key, double value);
  // True when the case's text so far sets `key` to the string `value`.
  bool has(const std::string& key, const std::string& value) const;
  std::string text() const { return text_->str(); }

 private:
  CaseDraw(uint64_t seed, std::string stream, std::shared_ptr<std::ostringstream> text);
  uint64_t seed_;
  std::string stream_name_;
  SeededStream stream_;
  uint64_t next_ = 0;
  std::shared_ptr<std::ostringstream> text_;
};

}  // namespace gradscope
