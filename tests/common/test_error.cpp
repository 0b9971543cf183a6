#include <cerrno>

#include <gtest/gtest.h>

#include "ddp/error.hpp"

TEST(Error, SystemErrorCarriesErrnoText) {
  ddp::SystemError e("connect to 127.0.0.1:1", ECONNREFUSED);
  EXPECT_EQ(e.code(), ECONNREFUSED);
  EXPECT_EQ(std::string(e.what()), "connect to 127.0.0.1:1: Connection refused");
}

TEST(Error, DurationsReadNaturally) {
  using std::chrono::milliseconds;
  EXPECT_EQ(ddp::format_duration(milliseconds(250)), "250 ms");
  EXPECT_EQ(ddp::format_duration(milliseconds(3000)), "3 s");
  EXPECT_EQ(ddp::format_duration(milliseconds(1500)), "1.5 s");
}

TEST(Error, FamilySharesOneBase) {
  try {
    throw ddp::TimeoutError("x");
  } catch (const ddp::Error& e) {
    EXPECT_STREQ(e.what(), "x");
  }
}
