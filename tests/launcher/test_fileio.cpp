// Whole-file reads and writes through close-on-exec descriptors (launcher/fileio.hpp).
#include <cerrno>
#include <string>

#include <gtest/gtest.h>

#include "launcher/fileio.hpp"
#include "test_util.hpp"

namespace {

TEST(LauncherFileio, WriteThenReadRoundTrip) {
  ddprun_test::TempDir dir;
  const std::string p = dir.file("a.json"), big(100000, 'x');
  ASSERT_TRUE(ddprun::write_file(p, big + "\n"));
  EXPECT_EQ(ddprun::read_file(p), big + "\n");
  ASSERT_TRUE(ddprun::write_file(p, "short"));  // truncates
  EXPECT_EQ(ddprun::read_file(p), "short");
  EXPECT_EQ(ddprun::read_file(p, 3), "sho");
  EXPECT_EQ(ddprun::read_file(p, 0), "");
}

TEST(LauncherFileio, FailuresSetErrno) {
  ddprun_test::TempDir dir;
  errno = 0;
  EXPECT_FALSE(ddprun::read_file(dir.file("missing")).has_value());
  EXPECT_EQ(errno, ENOENT);
  errno = 0;
  EXPECT_FALSE(ddprun::write_file(dir.file("no/such/folder/x"), "x"));
  EXPECT_EQ(errno, ENOENT);
  EXPECT_FALSE(ddprun::read_file(dir.path()).has_value());  // a folder: EISDIR on read
}

TEST(LauncherFileio, ProcFilesReadWhole) {
  auto s = ddprun::read_file("/proc/self/status");  // size 0 in stat, content nonetheless
  ASSERT_TRUE(s.has_value());
  EXPECT_NE(s->find("VmHWM:"), std::string::npos);
}

}  // namespace
