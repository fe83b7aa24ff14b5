#include "harness/generate/case_draw.h"

#include <utility>

namespace gradscope {

CaseDraw::CaseDraw(uint64_t seed, std::string stream)
    : CaseDraw(seed, std::move(stream), std::make_shared<std::ostringstream>()) {}

CaseDraw::CaseDraw(uint64_t seed, std::string stream, std::shared_ptr<std::ostringstream> text)
    : seed_(seed), stream_name_(std::move(stream)), stream_(seed_, stream_name_), text_(text) {}

double CaseDraw::uniform() {
  return stream_.uniform(next_++);
}

int64_t CaseDraw::between(int64_t lo, int64_t hi) {
  return lo + std::min<int64_t>(hi - lo, static_cast<int64_t>(uniform() * (hi - lo + 1)));
}

CaseDraw CaseDraw::substream(const std::string& name) {
  return CaseDraw(seed_, stream_name_ + "." + name, text_);
}

void CaseDraw::set(const std::string& key, const std::string& value) {
  *text_ << key << " = \"" << value << "\"\n";
}

void CaseDraw::set(const std::string& key, int64_t value) {
  *text_ << key << " = " << value << "\n";
}

void CaseDraw::set(const std::string& key, bool value) {
  *text_ << key << " = " << (value ? "true" : "false") << "\n";
}

void CaseDraw::set(const std::string& key, double value) {
  std::ostringstream s;
  s.precision(17);
  s << value;
  std::string t = s.str();
  // A TOML float needs a fraction or an exponent.
  if (t.find_first_of(".en") == std::string::npos) t += ".0";
  *text_ << key << " = " << t << "\n";
}

bool CaseDraw::has(const std::string& key, const std::string& value) const {
  return text().find(key + " = \"" + value + "\"") != std::string::npos;
}

}  // namespace gradscope
