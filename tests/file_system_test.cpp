#include "harness/common/file_system.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>

#include "harness/common/input_error.h"
#include "test_files.h"

namespace gradscope {
namespace {

TEST(FileSystem, FindsFilesBySuffixRecursivelyInOrder) {
  testing::TempDir dir;
  ASSERT_EQ(::mkdir(dir.path("b").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(dir.path("a").c_str(), 0755), 0);
  dir.write("b/2.toml", "");
  dir.write("a/1.toml", "");
  dir.write("a/notes.txt", "");
  dir.write("0.toml", "");
  EXPECT_EQ(
      files::find_files(dir.path(), ".toml"),
      (std::vector<std::string>{dir.path("0.toml"), dir.path("a/1.toml"), dir.path("b/2.toml")}));
  EXPECT_EQ(files::subdirectories(dir.path()), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(files::is_directory(dir.path("a")));
  EXPECT_FALSE(files::is_regular_file(dir.path("a")));
  EXPECT_TRUE(files::is_regular_file(dir.path("0.toml")));
  EXPECT_FALSE(files::is_directory(dir.path("missing")));
  // A folder that is not there is an error, not an empty list (a suite would run nothing).
  EXPECT_THROW(files::find_files(dir.path("missing"), ".toml"), InputError);
}

TEST(FileSystem, TempDirIsPrivateAndRemoveTreeTakesEverything) {
  const std::string dir = files::make_temp_dir("gradscope-fs-test");
  struct stat st {};
  ASSERT_EQ(::stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);  // mkdtemp: owner only
  ASSERT_EQ(::mkdir((dir + "/a").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((dir + "/a/b").c_str(), 0755), 0);
  { std::ofstream(dir + "/a/b/f.txt") << "x"; }
  { std::ofstream(dir + "/top.txt") << "y"; }
  const std::string other = files::make_temp_dir("gradscope-fs-test");
  EXPECT_NE(other, dir);  // a fresh name each call
  files::remove_tree(other);
  files::remove_tree(dir);
  EXPECT_FALSE(files::is_directory(dir));
  EXPECT_FALSE(files::is_directory(other));
}

TEST(FileSystem, ParentDirectory) {
  EXPECT_EQ(files::parent_directory("r.json"), ".");
  EXPECT_EQ(files::parent_directory("/r.json"), "/");
  EXPECT_EQ(files::parent_directory("out/x/r.json"), "out/x");
}

}  // namespace
}  // namespace gradscope
