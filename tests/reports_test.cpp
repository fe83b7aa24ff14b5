// The reports room. The HDF5 dump: written by reports/, read back tensor for tensor through the
// plain HDF5 C API, then through our reader; bad files are refused with the file named.
#include <gtest/gtest.h>

#include <hdf5.h>
#include <cmath>
#include <limits>

#include <fstream>
#include <iterator>
#include <sstream>

#include "reports/dump_tools.h"
#include "reports/hdf5_dump.h"
#include "reports/junit_report.h"
#include "test_files.h"

namespace gradscope::report {
namespace {

TensorData tensor(std::string dtype, std::vector<int64_t> shape, double start) {
  TensorData t{std::move(dtype), std::move(shape), {}};
  int64_t n = 1;
  for (auto d : t.shape) n *= d;
  for (int64_t i = 0; i < n; ++i) t.values.push_back(start + 0.25 * i);
  return t;
}

RunReport sample_report(double prod_offset = 0) {
  RunReport r;
  r.version = "test";
  r.environment = {"cpu", "abc123", std::nullopt, "2.11.0", std::nullopt, "g++"};
  CaseResult c;
  c.id = "mlp.bf16.h8i16.s1";
  c.kind = "mlp";
  c.spec = {{"kind", std::string("mlp")}, {"seed", int64_t{1}}, {"dtype", std::string("bf16")}};
  c.spec_toml = "kind = \"mlp\"\nseed = 1\n";
  c.inputs = {{"x", tensor("bf16", {4, 8}, -1)}};
  Check grad;
  grad.path = c.id + "/layer0/mlp/gate_proj/lora_A.grad";
  grad.passed = true;
  grad.max_abs = 0.5;
  grad.baseline_max_abs = 0.25;
  grad.tensors = CheckTensors{tensor("fp32", {2, 8}, prod_offset), tensor("fp32", {2, 8}, 0),
                              tensor("fp64", {2, 8}, 0), tensor("fp64", {2, 8}, 1)};
  Check out;
  out.path = c.id + "/layer0/mlp/down_proj/output";
  out.passed = true;
  out.tensors = CheckTensors{tensor("bf16", {4, 8}, 1), tensor("bf16", {4, 8}, 1),
                             tensor("fp64", {4, 8}, 1), std::nullopt};
  c.checks = {grad, out};
  r.cases.push_back(c);
  return r;
}

std::string bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(Hdf5Dump, TheHdf5CApiReadsBackEveryTensor) {
  testing::TempDir dir;
  const auto path = dir.path("d.h5");
  const auto report = sample_report();
  write_dump(path, report, {});
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  const auto& c = report.cases[0];
  const auto read = [&](const std::string& name, const TensorData& expected) {
    const hid_t ds = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
    ASSERT_GE(ds, 0) << name;
    const hid_t space = H5Dget_space(ds);
    std::vector<hsize_t> dims(H5Sget_simple_extent_ndims(space));
    H5Sget_simple_extent_dims(space, dims.data(), nullptr);
    EXPECT_EQ(std::vector<int64_t>(dims.begin(), dims.end()), expected.shape) << name;
    std::vector<double> values(expected.values.size());
    EXPECT_GE(H5Dread(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0);
    EXPECT_EQ(values, expected.values) << name;
    H5Sclose(space);
    H5Dclose(ds);
  };
  read("/" + c.id + "/inputs/x", c.inputs[0].second);
  for (const auto& check : c.checks) {
    read("/" + check.path + "/prod", check.tensors->prod);
    read("/" + check.path + "/base", *check.tensors->base);
    read("/" + check.path + "/ref", check.tensors->ref);
    if (check.tensors->floor) read("/" + check.path + "/floor", *check.tensors->floor);
  }
  H5Fclose(file);

  const Dump dump = read_dump(path);
  EXPECT_EQ(dump.attributes.at("format"), kDumpFormat);
  EXPECT_EQ(dump.attributes.at("commit"), "abc123");
  EXPECT_EQ(dump.cases, std::vector<std::string>{c.id});
  EXPECT_EQ(dump.datasets.size(), 8u);  // two checks' prod, base, ref, one floor, one input
  EXPECT_EQ(dump.group_attributes.at("/" + c.id).at("case_toml"), c.spec_toml);
  EXPECT_EQ(dump.group_attributes.at("/" + c.checks[0].path).at("baseline_max_abs"), "0.25");
}

TEST(Hdf5Dump, IdenticalRunsGiveIdenticalFiles) {
  testing::TempDir dir;
  write_dump(dir.path("a.h5"), sample_report(), {});
  write_dump(dir.path("b.h5"), sample_report(), {});
  EXPECT_EQ(bytes(dir.path("a.h5")), bytes(dir.path("b.h5")));
}

TEST(Hdf5Dump, GradientsOnlyAndFailingOnly) {
  testing::TempDir dir;
  write_dump(dir.path("g.h5"), sample_report(), {false, true});
  for (const auto& d : read_dump(dir.path("g.h5")).datasets) {
    EXPECT_NE(d.path.find(".grad/"), std::string::npos) << d.path;
  }
  write_dump(dir.path("f.h5"), sample_report(), {true, false});
  EXPECT_TRUE(read_dump(dir.path("f.h5")).cases.empty());
}

std::string dump_error(const std::string& path) {
  try {
    read_dump(path);
  } catch (const DumpError& e) {
    return e.what();
  }
  return "";
}

TEST(Hdf5Dump, BadFilesAreRefusedNamingTheFile) {
  testing::TempDir dir;
  EXPECT_NE(dump_error(dir.path("missing.h5")).find("missing.h5: file not found"),
            std::string::npos);
  const auto text = dir.write("text.h5", "not hdf5 at all");
  EXPECT_NE(dump_error(text).find("text.h5: not an HDF5 file"), std::string::npos);
  write_dump(dir.path("good.h5"), sample_report(), {});
  const auto content = bytes(dir.path("good.h5"));
  std::ofstream(dir.path("truncated.h5"), std::ios::binary)
      << content.substr(0, content.size() / 2);
  EXPECT_NE(dump_error(dir.path("truncated.h5")).find("truncated.h5"), std::string::npos);
  const hid_t f = H5Fcreate(dir.path("other.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  H5Fclose(f);
  EXPECT_NE(dump_error(dir.path("other.h5")).find("other.h5: not a gradscope dump"),
            std::string::npos);
}

TEST(DumpTools, DiffOfADumpWithItselfFindsNothing) {
  testing::TempDir dir;
  write_dump(dir.path("a.h5"), sample_report(), {});
  std::ostringstream out;
  const auto dump = read_dump(dir.path("a.h5"));
  const auto r = diff_dumps(out, dump, "a", dump, "a", {});
  EXPECT_EQ(r.differing, 0);
  EXPECT_EQ(r.tensors, 8);
}

// A valid dump changed through the HDF5 C API by `edit` (given the open file).
template <typename Edit>
std::string edited_dump_error(testing::TempDir& dir, const std::string& name, Edit&& edit) {
  const auto path = dir.path(name);
  write_dump(path, sample_report(), {});
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  EXPECT_GE(file, 0);
  edit(file, "/" + sample_report().cases[0].id);
  H5Fclose(file);
  return dump_error(path);
}

// The walk is bounded on any file (docs/reports.md, "Limits of the reader"): every object
// reached once, by hard links only, so a file that links a group back to its ancestor ends.
TEST(Hdf5Dump, LinksThatMakeTheTreeAGraphAreRefused) {
  testing::TempDir dir;
  const auto cycle = edited_dump_error(dir, "cycle.h5", [](hid_t f, const std::string& c) {
    EXPECT_GE(
        H5Lcreate_hard(f, c.c_str(), f, (c + "/layer0/mlp/back").c_str(), H5P_DEFAULT, H5P_DEFAULT),
        0);
  });
  const std::string c = "/" + sample_report().cases[0].id;
  EXPECT_NE(cycle.find("cycle.h5: group " + c + "/layer0/mlp links back to " + c),
            std::string::npos)
      << cycle;
  const auto twice = edited_dump_error(dir, "twice.h5", [](hid_t f, const std::string& c) {
    EXPECT_GE(H5Lcreate_hard(f, (c + "/inputs/x").c_str(), f, (c + "/x_again").c_str(), H5P_DEFAULT,
                             H5P_DEFAULT),
              0);
  });
  EXPECT_NE(twice.find("is a second link to"), std::string::npos) << twice;
  const auto soft = edited_dump_error(dir, "soft.h5", [](hid_t f, const std::string& c) {
    EXPECT_GE(H5Lcreate_soft("/", f, (c + "/up").c_str(), H5P_DEFAULT, H5P_DEFAULT), 0);
  });
  EXPECT_NE(soft.find("/up is a soft link"), std::string::npos) << soft;
  const auto deep = edited_dump_error(dir, "deep.h5", [](hid_t f, const std::string&) {
    std::string path;
    for (int level = 0; level <= kMaxDumpDepth; ++level) {
      path += "/g";
      const hid_t g = H5Gcreate2(f, path.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      EXPECT_GE(g, 0);
      H5Gclose(g);
    }
  });
  EXPECT_NE(deep.find("groups nested deeper than 32 levels"), std::string::npos) << deep;
}

TEST(Hdf5Dump, ADatasetOfStringsIsNamedNotCalledCorrupt) {
  testing::TempDir dir;
  const auto strings = edited_dump_error(dir, "strings.h5", [](hid_t f, const std::string& c) {
    const hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, 8);
    const hsize_t n = 2;
    const hid_t space = H5Screate_simple(1, &n, nullptr);
    const hid_t ds = H5Dcreate2(f, (c + "/inputs/names").c_str(), type, space, H5P_DEFAULT,
                                H5P_DEFAULT, H5P_DEFAULT);
    EXPECT_GE(ds, 0);
    const char values[16] = "x\0\0\0\0\0\0\0dy\0\0\0\0\0";
    H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values);
    H5Dclose(ds);
    H5Sclose(space);
    H5Tclose(type);
  });
  EXPECT_NE(strings.find("/inputs/names holds strings; a gradscope dump's datasets hold numbers"),
            std::string::npos)
      << strings;
}

TEST(DumpTools, DiffNamesTheTensorsThatDiffer) {
  testing::TempDir dir;
  write_dump(dir.path("a.h5"), sample_report(), {});
  write_dump(dir.path("b.h5"), sample_report(1e-3), {});
  std::ostringstream out;
  const auto r =
      diff_dumps(out, read_dump(dir.path("a.h5")), "a", read_dump(dir.path("b.h5")), "b", {});
  EXPECT_EQ(r.differing, 1);
  const auto group = out.str().find("gate_proj/lora_A.grad\n");
  ASSERT_NE(group, std::string::npos) << out.str();
  const auto prod = out.str().find("    prod ", group);
  ASSERT_NE(prod, std::string::npos);
  EXPECT_EQ(out.str().find("DIFFERS"), out.str().find("DIFFERS", prod)) << out.str();
  EXPECT_LT(out.str().find("DIFFERS", prod), out.str().find("    ref ", prod));
  // Loose tolerances accept the same difference.
  std::ostringstream loose;
  EXPECT_EQ(diff_dumps(loose, read_dump(dir.path("a.h5")), "a", read_dump(dir.path("b.h5")), "b",
                       {1e-2, 1e-2})
                .differing,
            0);
}

TEST(DumpTools, DiffTreatsNaNAsADifferenceAndEqualInfinitiesAsSame) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Dump a, b;
  a.cases = b.cases = {"c"};
  a.datasets = {{"/c/t/prod", "fp32", {3}, {1.0, inf, 2.0}},
                {"/c/u/prod", "fp32", {2}, {-inf, 1.0}}};
  b.datasets = {{"/c/t/prod", "fp32", {3}, {1.0, inf, nan}},
                {"/c/u/prod", "fp32", {2}, {-inf, 1.0}}};
  std::ostringstream out;
  const auto r = diff_dumps(out, a, "a", b, "b", {});
  EXPECT_EQ(r.differing, 1) << out.str();
  EXPECT_TRUE(std::isnan(r.json["tensors"][0]["max_abs"].is_null()
                             ? nan
                             : r.json["tensors"][0]["max_abs"].get<double>()));
  EXPECT_EQ(r.json["tensors"][0]["status"], "differs");
  EXPECT_EQ(r.json["tensors"][1]["status"], "same");
  EXPECT_EQ(r.json["tensors"][1]["max_abs"], 0.0);
}

TEST(DumpTools, DiffRefusesDumpsOfDifferentCases) {
  testing::TempDir dir;
  auto other = sample_report();
  other.cases[0].id = "mlp.bf16.h8i16.s2";
  for (auto& c : other.cases[0].checks) c.path.replace(0, c.path.find('/'), other.cases[0].id);
  write_dump(dir.path("a.h5"), sample_report(), {});
  write_dump(dir.path("b.h5"), other, {});
  std::ostringstream out;
  try {
    diff_dumps(out, read_dump(dir.path("a.h5")), "a.h5", read_dump(dir.path("b.h5")), "b.h5", {});
    FAIL();
  } catch (const DumpError& e) {
    EXPECT_NE(std::string(e.what()).find("only in a.h5:\n  mlp.bf16.h8i16.s1"), std::string::npos)
        << e.what();
  }
}

TEST(DumpTools, ShowPrintsTheTreeOrOnePath) {
  testing::TempDir dir;
  write_dump(dir.path("a.h5"), sample_report(), {});
  const auto dump = read_dump(dir.path("a.h5"));
  std::ostringstream all, one;
  show_dump(all, dump, "a.h5");
  EXPECT_NE(all.str().find("/mlp.bf16.h8i16.s1/layer0/mlp/down_proj/output"), std::string::npos);
  EXPECT_NE(all.str().find("bf16  [4, 8]"), std::string::npos) << all.str();
  show_dump(one, dump, "a.h5", "mlp.bf16.h8i16.s1/inputs");
  EXPECT_NE(one.str().find("inputs"), std::string::npos);
  EXPECT_EQ(one.str().find("down_proj"), std::string::npos);
  EXPECT_THROW(show_dump(one, dump, "a.h5", "/nothing/here"), DumpError);
}

TEST(JUnit, OneTestcasePerCheckAndEscapedFailures) {
  auto r = sample_report();
  r.cases[0].checks[1].passed = false;
  r.cases[0].checks[1].failure = "path: err(prod) 3 > limit 1 <&> \"quoted\"\n        more";
  const auto xml = to_junit_xml(r);
  EXPECT_NE(xml.find("<testsuites name=\"gradscope\" tests=\"2\" failures=\"1\""),
            std::string::npos)
      << xml;
  EXPECT_NE(
      xml.find(
          "<testcase classname=\"mlp.bf16.h8i16.s1\" name=\"layer0/mlp/gate_proj/lora_A.grad\""),
      std::string::npos);
  EXPECT_NE(xml.find("message=\"path: err(prod) 3 &gt; limit 1 &lt;&amp;&gt; &quot;quoted&quot;\""),
            std::string::npos)
      << xml;
  EXPECT_EQ(xml.find("<&>"), std::string::npos);
}

// A check not judged (out of range: the case's range or an attention past the floor's model)
// is a skipped testcase carrying the reason, not a failure.
TEST(JUnit, ACheckNotJudgedIsSkipped) {
  auto r = sample_report();
  r.cases[0].checks[1].passed = false;
  r.cases[0].checks[1].out_of_range = true;
  r.cases[0].checks[1].failure = "path: cannot be judged: layer 0's attention\n        more";
  const auto xml = to_junit_xml(r);
  EXPECT_NE(xml.find("tests=\"2\" failures=\"0\" errors=\"0\" skipped=\"1\""), std::string::npos)
      << xml;
  EXPECT_NE(xml.find("<skipped message=\"path: cannot be judged: layer 0&apos;s attention\"/>"),
            std::string::npos)
      << xml;
  EXPECT_EQ(xml.find("<failure"), std::string::npos) << xml;
}

}  // namespace
}  // namespace gradscope::report

#include "reports/html_report.h"

namespace gradscope::report {
namespace {

TEST(Html, SelfContainedWithTablesPlotsAndFailures) {
  auto r = sample_report();
  r.cases[0].checks[0].error_histogram.assign(kErrorBins, 0);
  r.cases[0].checks[0].error_histogram[10] = 5;
  r.cases[0].checks[1].passed = false;
  r.cases[0].checks[1].failure = "down_proj/output: err(prod) 3 > limit <1>";
  r.cases[0].checks[1].baseline_max_abs = 0.5;
  r.cases[0].checks[1].max_abs = 3;
  const auto html = to_html(r);
  EXPECT_NE(html.find("<h1>gradscope report</h1><p>0 passed, 1 failed"), std::string::npos);
  EXPECT_NE(html.find("id=\"mlp.bf16.h8i16.s1\""), std::string::npos);
  EXPECT_NE(
      html.find(
          "<td "
          "class=\"l\">layer0/mlp/gate_proj/lora_A.grad</td><td>0.5</td><td>0.25</td><td>2</td>"),
      std::string::npos)
      << html;
  EXPECT_NE(html.find("<pre>down_proj/output: err(prod) 3 &gt; limit &lt;1&gt;"),
            std::string::npos);
  EXPECT_NE(html.find("<title>err(prod) vs err(base)</title>"), std::string::npos);
  EXPECT_NE(html.find("<title>5 elements with |prod - ref| in 1e-5 .. 1e-4.5</title>"),
            std::string::npos)
      << html;
  // Offline: no scripts, no external resources.
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_EQ(html.find("href=\"http"), std::string::npos);
}

}  // namespace
}  // namespace gradscope::report
