#include <cstdint>
#include <thread>

#include <gtest/gtest.h>

#include "ddp/error.hpp"
#include "ddp/store.hpp"
#include "test_timeouts.hpp"

using namespace std::chrono_literals;

TEST(MemoryStore, SetGetAddCompareSet) {
  ddp::MemoryStore s;
  s.set("a", std::string("x\0y", 3));
  EXPECT_EQ(s.get("a"), std::string("x\0y", 3));
  EXPECT_EQ(s.add("c", 2), 2);
  EXPECT_EQ(s.add("c", 3), 5);
  EXPECT_EQ(s.get("c"), "5");
  EXPECT_EQ(s.compare_set("m", "e", "d"), "e");  // missing + non-empty expected
  EXPECT_FALSE(s.check({"m"}));
  EXPECT_EQ(s.compare_set("m", "", "d"), "d");  // missing + empty expected sets
  EXPECT_EQ(s.compare_set("m", "zz", "q"), "d");
  EXPECT_EQ(s.compare_set("m", "d", "q"), "q");
  EXPECT_EQ(s.num_keys(), 3);
  EXPECT_TRUE(s.delete_key("m"));
  EXPECT_FALSE(s.delete_key("m"));
}

TEST(MemoryStore, AddPastTheLargestCounterWrapsAsTheServersDoes) {
  ddp::MemoryStore s;
  s.set("c", "9223372036854775807");
  EXPECT_EQ(s.add("c", 1), INT64_MIN);
  EXPECT_EQ(s.add("c", -1), INT64_MAX);
}

TEST(MemoryStore, WaitWakesAndTimesOutNamingKeys) {
  ddp::MemoryStore s;
  std::thread t([&] {
    std::this_thread::sleep_for(20ms);
    s.set("k1", "v");
  });
  s.wait({"k1"}, ddp::test::scaled(30s));  // a hang guard: the key comes ~20 ms in
  t.join();
  try {
    s.wait({"k1", "missing-key"}, 30ms);
    FAIL() << "no timeout";
  } catch (const ddp::TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("missing-key"), std::string::npos);
    EXPECT_EQ(std::string(e.what()).find("k1,"), std::string::npos);
  }
}

TEST(PrefixStore, KeysArePrefixed) {
  auto inner = std::make_shared<ddp::MemoryStore>();
  ddp::PrefixStore p("attempt_1", inner);
  p.set("k", "v");
  EXPECT_TRUE(inner->check({"attempt_1/k"}));
  EXPECT_EQ(p.get("k"), "v");
  EXPECT_EQ(p.add("n", 1), 1);
  EXPECT_EQ(inner->get("attempt_1/n"), "1");
}
