#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <set>
#include <sstream>

#include "harness/catalog/case_file.h"
#include "harness/catalog/kind_registry.h"
#include "harness/common/input_error.h"
#include "harness/engine/case_kind.h"
#include "harness/spec/case_spec.h"
#include "test_files.h"

namespace gradscope {
namespace {

using testing::TempDir;

std::string load_error(const std::string& path) {
  try {
    load_case_file(path);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(CaseFile, DefaultsFillEveryField) {
  TempDir dir;
  const auto cases = load_case_file(dir.write("a.toml", "kind = \"dequant\"\n"));
  ASSERT_EQ(cases.size(), 1u);
  const auto& c = cases[0];
  EXPECT_EQ(c.get_int("bits"), 4);
  EXPECT_EQ(c.get_int("group_size"), 128);
  EXPECT_EQ(c.get_string("dtype"), "fp32");
  EXPECT_EQ(c.get_string("device"), "cpu");
  EXPECT_EQ(c.origin("bits"), "default");
  EXPECT_EQ(c.fields().size(), schema_for_kind("dequant").size());
  EXPECT_EQ(find_kind("dequant")->case_id(c), "dequant.fp32.k256n128.b4g128.v1.sym.s1");
}

TEST(CaseFile, MatrixExpandsToTheCartesianProduct) {
  TempDir dir;
  const auto cases = load_case_file(dir.write("m.toml", R"(kind = "dequant"
in_features = 64
out_features = 32
[matrix]
bits = [2, 3, 4, 8]
sym = [true, false]
dtype = ["fp16", "bf16", "fp32"]
)"));
  EXPECT_EQ(cases.size(), 24u);
  std::set<std::string> ids;
  for (const auto& c : cases) ids.insert(find_kind("dequant")->case_id(c));
  EXPECT_EQ(ids.size(), 24u);
  EXPECT_TRUE(ids.count("dequant.bf16.k64n32.b3g128.v1.asym.s1")) << *ids.begin();
}

// [[cases]] rows (a covering array's), each crossed with the matrix, in file order.
TEST(CaseFile, CaseEntriesAreRowsCrossedWithTheMatrix) {
  TempDir dir;
  const auto cases = load_case_file(dir.write("r.toml", R"(kind = "dequant"
out_features = 32
[matrix]
dtype = ["fp16", "bf16"]
[[cases]]
bits = 3
in_features = 96
[[cases]]
bits = 4
in_features = 40
sym = false
)"));
  ASSERT_EQ(cases.size(), 4u);
  EXPECT_EQ(find_kind("dequant")->case_id(cases[0]), "dequant.fp16.k96n32.b3g128.v1.sym.s1");
  EXPECT_EQ(find_kind("dequant")->case_id(cases[3]), "dequant.bf16.k40n32.b4g128.v1.asym.s1");
  EXPECT_EQ(cases[3].origin("sym"), dir.path("r.toml") + ":11");
  // A key in an entry and at the top level or in [matrix]; an entry's value validated.
  EXPECT_NE(load_error(dir.write("t.toml", "kind = \"dequant\"\nbits = 4\n[[cases]]\nbits = 2\n"))
                .find("t.toml:4: key 'bits' is set both at the top level and in [[cases]]"),
            std::string::npos);
  EXPECT_NE(load_error(dir.write("m.toml",
                                 "kind = \"dequant\"\n[matrix]\nbits = [4]\n[[cases]]\nbits = 2\n"))
                .find("m.toml:5: key 'bits' is set both in [matrix] and in [[cases]]"),
            std::string::npos);
  EXPECT_NE(
      load_error(dir.write("v.toml", "kind = \"dequant\"\n[[cases]]\nbits = 5\n")).find("v.toml:3"),
      std::string::npos);
  EXPECT_NE(load_error(dir.write("u.toml", "kind = \"dequant\"\n[[cases]]\nrank = 5\n"))
                .find("unknown key 'cases.rank' for kind 'dequant'"),
            std::string::npos);
  EXPECT_NE(load_error(dir.write("a.toml", "kind = \"dequant\"\ncases = [1]\n"))
                .find("key 'cases' must be a non-empty array of tables"),
            std::string::npos);
  // A shape rule checked on each row: 3-bit rows need multiples of 32.
  EXPECT_NE(
      load_error(dir.write("s.toml", "kind = \"dequant\"\n[[cases]]\nbits = 3\nin_features = 40\n"))
          .find("in_features"),
      std::string::npos);
}

TEST(CaseFile, MalformedTomlNamesFileAndLine) {
  TempDir dir;
  const auto path = dir.write("bad.toml", "kind = \"dequant\"\nbits = = 4\n");
  const auto err = load_error(path);
  EXPECT_NE(err.find(path + ":2"), std::string::npos) << err;
  EXPECT_NE(err.find("malformed TOML"), std::string::npos) << err;
}

TEST(CaseFile, UnknownKeyNamesKeyLineAndKnownKeys) {
  TempDir dir;
  const auto path = dir.write("k.toml", "kind = \"dequant\"\n\nbitz = 4\n");
  const auto err = load_error(path);
  EXPECT_NE(err.find(path + ":3: unknown key 'bitz'"), std::string::npos) << err;
  EXPECT_NE(err.find("group_size"), std::string::npos) << err;
}

TEST(CaseFile, WrongTypeNamesExpectedType) {
  TempDir dir;
  const auto err = load_error(dir.write("t.toml", "kind = \"dequant\"\nbits = \"4\"\n"));
  EXPECT_NE(err.find(":2: key 'bits' must be an integer, got a string"), std::string::npos) << err;
  const auto err2 =
      load_error(dir.write("t2.toml", "kind = \"dequant\"\n[matrix]\nsym = [true, 1]\n"));
  EXPECT_NE(err2.find("key 'sym' must be a boolean, got an integer"), std::string::npos) << err2;
}

TEST(CaseFile, OutOfRangeValues) {
  TempDir dir;
  EXPECT_NE(load_error(dir.write("b.toml", "kind = \"dequant\"\nbits = 5\n"))
                .find("key 'bits' is 5; expected one of 2, 3, 4, 8"),
            std::string::npos);
  EXPECT_NE(load_error(dir.write("n.toml", "kind = \"dequant\"\nin_features = -64\n"))
                .find("key 'in_features' is -64"),
            std::string::npos);
  EXPECT_NE(load_error(dir.write("d.toml", "kind = \"dequant\"\ndtype = \"fp8\"\n"))
                .find("expected one of fp32, fp16, bf16"),
            std::string::npos);
  EXPECT_NE(load_error(dir.write("g.toml", "kind = \"dequant\"\ngroup_size = 0\n"))
                .find("group_size must be -1 or positive"),
            std::string::npos);
}

TEST(CaseFile, ImpossibleShapesNameTheField) {
  TempDir dir;
  const auto path = dir.write("s.toml", "kind = \"dequant\"\nbits = 3\nin_features = 48\n");
  const auto err = load_error(path);
  EXPECT_NE(err.find(path + ":3: in_features must be a multiple of 32 for 3-bit"),
            std::string::npos)
      << err;
  EXPECT_NE(load_error(dir.write("s2.toml", "kind = \"dequant\"\nbits = 4\nout_features = 12\n"))
                .find("out_features must be a multiple of 8"),
            std::string::npos);
  EXPECT_NE(
      load_error(dir.write("s3.toml",
                           "kind = \"dequant\"\nbits = 4\nout_features = 8\nstorage = \"fp16\"\n"))
          .find("storage"),
      std::string::npos);
}

TEST(CaseFile, KindMissingUnknownOrFileAbsent) {
  TempDir dir;
  EXPECT_NE(load_error(dir.write("nokind.toml", "bits = 4\n")).find("missing key 'kind'"),
            std::string::npos);
  EXPECT_NE(load_error(dir.write("k.toml", "kind = \"conv\"\n")).find("unknown kind 'conv'"),
            std::string::npos);
  EXPECT_NE(load_error(dir.path("absent.toml")).find("case file not found"), std::string::npos);
}

TEST(CaseFile, KeyBothTopLevelAndInMatrixIsAnError) {
  TempDir dir;
  EXPECT_NE(load_error(dir.write("c.toml", "kind = \"dequant\"\nbits = 4\n[matrix]\nbits = [2]\n"))
                .find("both at the top level and in [matrix]"),
            std::string::npos);
}

TEST(CaseFile, MatrixThatExplodesIsRefusedBeforeExpansion) {
  std::string text = "kind = \"dequant\"\n[matrix]\n";
  for (const char* key : {"seed", "in_features", "out_features", "group_size"}) {
    text += std::string(key) + " = [";
    for (int i = 1; i <= 20; ++i) text += std::to_string(32 * i) + (i < 20 ? ", " : "]\n");
  }
  try {
    parse_case_text(text, "big.toml");
    FAIL() << "20^4 cases were expanded";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("big.toml:", 0), 0u) << what;
    EXPECT_NE(what.find(": [matrix] expands to more than 100000 cases"), std::string::npos) << what;
  }
}

TEST(CaseFile, CharactersTheTomlLibraryMishandlesAreRefused) {
  // The case-file fuzzer's find: toml++ 3.3.0 hits __builtin_unreachable() on "[\u03FC".
  for (const std::string text : {"[\xCF\xBC", "kind = \"dequant\"\n# caf\xC3\xA9\n"}) {
    try {
      parse_case_text(text, "u.toml");
      FAIL() << text;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("is not accepted in case files"), std::string::npos)
          << e.what();
    }
  }
  try {
    parse_case_text("kind = \"dequant\"\n# caf\xC3\xA9\n", "u.toml");
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("u.toml:2:6: character U+00E9"), std::string::npos)
        << e.what();
  }
  // Other non-ASCII text (an arrow in a description) still loads.
  EXPECT_EQ(
      parse_case_text("kind = \"dequant\"\ndescription = \"a \xE2\x86\x92 b\"\n", "a.toml").size(),
      1u);
}

TEST(CaseFile, ControlCharactersAreRefusedBeforeTheTomlLibrarySeesThem) {
  // TOML allows no control character but tab, LF and CR: named with line and column.
  const std::string nul("seed = 1\n[\0x", 12);
  for (const auto& [text, expected] : std::vector<std::pair<std::string, std::string>>{
           {nul, "c.toml:2:2: control character U+0000"},
           {"kind = \"dequant\"\x1b\n", "c.toml:1:17: control character U+001B"},
           {"# \x7f\n", "c.toml:1:3: control character U+007F"}}) {
    try {
      parse_case_text(text, "c.toml");
      FAIL() << text;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  }
  // Tabs and CRLF line ends are TOML.
  EXPECT_EQ(parse_case_text("kind\t= \"dequant\"\r\nbits = 4\r\n", "t.toml").size(), 1u);
}

TEST(CaseFile, TableHeadersTheTomlLibraryAssumesCannotOccurAreMalformedTomlInEveryBuild) {
  // The case-file fuzzer's find (toml++ issue #294): a header whose key starts with a character
  // no key starts with reached an assertion, or in a clang release build an assumption.
  for (const std::string text : {"[<\n", "[&", "kind = \"dequant\"\n[[[1]]]\n", "[[=\n"}) {
    try {
      parse_case_text(text, "h.toml");
      FAIL() << text;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("malformed TOML"), std::string::npos) << e.what();
    }
  }
}

TEST(CaseFile, AValuePaddedWithUnderscoresIsRefusedBeforeTheTomlLibraryScansIt) {
  // The case-file fuzzer's find: a date-like value with 117 underscores made toml++ 3.3.0 step
  // back further than its scan history (an assertion in a noexcept function).
  const std::string padded = "e = 4---" + std::string(117, '_') + "--1-e= 4--4 ";
  try {
    parse_case_text(padded, "p.toml");
    FAIL() << padded;
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("p.toml:1:41: more than 32 underscores in one word"),
              std::string::npos)
        << e.what();
  }
  // Underscores between words, and up to 32 in one, are still read.
  EXPECT_EQ(parse_case_text("kind = \"dequant\"\ndescription = \"" + std::string(32, '_') + " " +
                                std::string(32, '_') + "\"\n",
                            "d.toml")
                .size(),
            1u);
}

TEST(CaseFile, TextAndFileLoadAlike) {
  TempDir dir;
  const std::string text = "kind = \"dequant\"\n[matrix]\nbits = [3, 4]\n";
  const auto from_file = load_case_file(dir.write("t.toml", text));
  const auto from_text = parse_case_text(text, dir.path("t.toml"));
  ASSERT_EQ(from_file.size(), 2u);
  ASSERT_EQ(from_text.size(), 2u);
  EXPECT_EQ(from_file[1].to_toml(), from_text[1].to_toml());
}

TEST(CaseFile, OverridesAreValidated) {
  TempDir dir;
  auto cases = load_case_file(dir.write("o.toml", "kind = \"dequant\"\n"));
  override_field(cases[0], "dtype", "bf16", "--dtype");
  EXPECT_EQ(cases[0].get_string("dtype"), "bf16");
  EXPECT_EQ(cases[0].origin("dtype"), "--dtype");
  EXPECT_THROW(override_field(cases[0], "seed", "x1", "--seed"), InputError);
}

}  // namespace
}  // namespace gradscope

namespace gradscope {
namespace {

// docs/case-files.md is the format's documentation: every field of every kind is in it.
TEST(CaseFile, EveryFieldIsDocumented) {
  std::ifstream in(std::string(GRADSCOPE_TEST_CASES_DIR) + "/../docs/case-files.md");
  ASSERT_TRUE(in) << "docs/case-files.md missing";
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const auto& kind : kind_names()) {
    bool heading = false;  // a "## " heading names the kind
    std::istringstream lines(doc);
    for (std::string line; std::getline(lines, line);) {
      heading = heading ||
                (line.rfind("## ", 0) == 0 && (line.find("\"" + kind + "\"") != std::string::npos ||
                                               line.find("`" + kind + "`") != std::string::npos));
    }
    EXPECT_TRUE(heading) << kind << " has no section in docs/case-files.md";
    for (const auto& field : schema_for_kind(kind)) {
      EXPECT_NE(doc.find("| `" + field.name + "` |"), std::string::npos)
          << kind << "." << field.name << " is not documented";
    }
  }
}

}  // namespace
}  // namespace gradscope
