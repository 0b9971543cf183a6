// Correctness of every CPU collective x dtype x reduce op for world sizes 1-4, over shared
// memory and TCP, through the ring (tiny chunks/rings so sizes span many chunks and wrap)
// the flat small-message algorithm and the slice all-reduce (tiny stages so sizes span many
// stages and slices are uneven or empty).
#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "harness.hpp"

using namespace ddp_test;
using ddp::DType;
using ddp::ReduceOp;

namespace {

struct Case {
  const char* label;
  GroupConfig cfg;
  std::vector<size_t> sizes;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.label; }

std::string describe(DType t, ReduceOp op, size_t count) {
  return std::string(ddp::dtype_name(t)) + "/" + std::string(ddp::reduce_op_name(op)) + "/n=" +
         std::to_string(count);
}

// Every rank checks its own result; failures are collected (EXPECT from threads is fine in
// gtest on POSIX, but a bounded list keeps the output short).
struct Failures {
  std::mutex mu;
  std::vector<std::string> list;
  void add(std::string s) {
    std::lock_guard l(mu);
    if (list.size() < 20) list.push_back(std::move(s));
  }
};

void check_all(const Case& c) {
  Failures f;
  auto errors = run_ranks(c.cfg, [&](ddp::ProcessGroup& pg) {
    const int n = pg.size(), r = pg.rank();
    for (DType t : kAllDTypes) {
      const size_t es = ddp::dtype_size(t);
      for (size_t count : c.sizes) {
        for (ReduceOp op : kAllOps) {
          // all_reduce
          std::vector<uint8_t> buf(count * es + 1);
          for (size_t i = 0; i < count; ++i) put(t, buf.data(), i, input_value(op, t, r, i));
          pg.all_reduce(buf.data(), count, t, {.op = op});
          for (size_t i = 0; i < count; ++i) {
            double want = expected_value(op, t, n, i), got = get(t, buf.data(), i);
            if (!close_enough(op, t, got, want)) {
              f.add("rank " + std::to_string(r) + " all_reduce " + describe(t, op, count) + " [" +
                    std::to_string(i) + "] = " + std::to_string(got) + ", want " + std::to_string(want));
              break;
            }
          }
          // reduce_scatter: block b of rank r's input uses index b*count + i
          std::vector<uint8_t> in(count * n * es + 1), out(count * es + 1);
          for (size_t i = 0; i < count * n; ++i) put(t, in.data(), i, input_value(op, t, r, i));
          pg.reduce_scatter(in.data(), out.data(), count, t, {.op = op});
          for (size_t i = 0; i < count; ++i) {
            double want = expected_value(op, t, n, r * count + i), got = get(t, out.data(), i);
            if (!close_enough(op, t, got, want)) {
              f.add("rank " + std::to_string(r) + " reduce_scatter " + describe(t, op, count) +
                    " [" + std::to_string(i) + "] = " + std::to_string(got) + ", want " +
                    std::to_string(want));
              break;
            }
          }
        }
        // broadcast from every root
        for (int root = 0; root < n; ++root) {
          std::vector<uint8_t> buf(count * es + 1);
          for (size_t i = 0; i < count; ++i) put(t, buf.data(), i, r == root ? static_cast<double>((i + root) % 50) : 99.0);
          pg.broadcast(buf.data(), count, t, {.root = root});
          for (size_t i = 0; i < count; ++i)
            if (get(t, buf.data(), i) != static_cast<double>((i + root) % 50)) {
              f.add("rank " + std::to_string(r) + " broadcast root " + std::to_string(root) + " " +
                    describe(t, ReduceOp::kSum, count) + " [" + std::to_string(i) + "]");
              break;
            }
        }
        // all_gather
        std::vector<uint8_t> in(count * es + 1), out(count * n * es + 1);
        for (size_t i = 0; i < count; ++i) put(t, in.data(), i, static_cast<double>((r * 7 + i) % 60));
        pg.all_gather(in.data(), out.data(), count, t);
        for (int p = 0; p < n; ++p)
          for (size_t i = 0; i < count; ++i)
            if (get(t, out.data(), p * count + i) != static_cast<double>((p * 7 + i) % 60)) {
              f.add("rank " + std::to_string(r) + " all_gather " + describe(t, ReduceOp::kSum, count) +
                    " block " + std::to_string(p) + " [" + std::to_string(i) + "]");
              p = n;
              break;
            }
      }
    }
    pg.barrier();
  });
  expect_no_errors(errors);
  for (auto& s : f.list) ADD_FAILURE() << s;
}

class Collectives : public ::testing::TestWithParam<Case> {};

TEST_P(Collectives, EveryOpDtypeAndReduceOp) { check_all(GetParam()); }

GroupConfig ring_cfg(int n, ddp::Transport t) {
  GroupConfig c;
  c.n = n;
  c.transport = t;
  c.small = 0;      // always the ring
  c.slice = 0;
  c.chunk = 256;    // many chunks per segment
  c.ring = 1024;    // shared-memory rings wrap constantly
  return c;
}
// Every all-reduce takes the slice algorithm (the other collectives the ring).
GroupConfig slice_cfg(int n) {
  GroupConfig c = ring_cfg(n, ddp::Transport::kAuto);
  c.slice = 1;
  c.slice_stage = 256;  // 4-256 elements per stage: many stages, a short last one
  return c;
}
GroupConfig mixed_cfg(std::vector<std::string> hosts) {
  GroupConfig c = ring_cfg(static_cast<int>(hosts.size()), ddp::Transport::kAuto);
  c.host_ids = std::move(hosts);
  return c;
}
GroupConfig flat_cfg(int n) {
  GroupConfig c;
  c.n = n;
  c.slice = 0;
  return c;
}

const std::vector<size_t> kSizes = {0, 1, 7, 1001};

INSTANTIATE_TEST_SUITE_P(
    Cpu, Collectives,
    ::testing::Values(Case{"n1", ring_cfg(1, ddp::Transport::kAuto), kSizes},
                      Case{"ring_shm_n2", ring_cfg(2, ddp::Transport::kAuto), kSizes},
                      Case{"ring_shm_n3", ring_cfg(3, ddp::Transport::kAuto), kSizes},
                      Case{"ring_shm_n4", ring_cfg(4, ddp::Transport::kAuto), kSizes},
                      Case{"ring_tcp_n2", ring_cfg(2, ddp::Transport::kTcp), kSizes},
                      Case{"ring_tcp_n3", ring_cfg(3, ddp::Transport::kTcp), kSizes},
                      Case{"ring_tcp_n4", ring_cfg(4, ddp::Transport::kTcp), kSizes},
                      Case{"mixed_2hosts_n4", mixed_cfg({"A", "A", "B", "B"}), kSizes},
                      Case{"mixed_2hosts_n3", mixed_cfg({"A", "B", "A"}), kSizes},
                      Case{"flat_shm_n2", flat_cfg(2), {1, 7, 1001}},
                      Case{"flat_shm_n3", flat_cfg(3), {1, 7, 1001}},
                      Case{"flat_shm_n4", flat_cfg(4), {1, 7, 1001}},
                      Case{"slice_shm_n2", slice_cfg(2), {0, 1, 7, 63, 1001}},
                      Case{"slice_shm_n3", slice_cfg(3), {0, 1, 7, 63, 1001}},
                      Case{"slice_shm_n4", slice_cfg(4), {0, 1, 7, 63, 1001}},
                      // slice for all-reduce above 64 bytes, flat below (the mixture must
                      // keep the shared barrier sequence in step)
                      Case{"slice_flat_mix_n3",
                           [] {
                             GroupConfig c = slice_cfg(3);
                             c.small = 64;
                             c.slice = 65;
                             return c;
                           }(),
                           {1, 7, 16, 17, 1001}}),
    [](const auto& info) { return std::string(info.param.label); });

// Default chunking, sizes far above a chunk and the small-message threshold.
// slice: all-reduce threshold of the slice algorithm (0: ring only).
void large(int n, ddp::Transport t, size_t slice = 0, size_t stage = 1 << 20) {
  GroupConfig c;
  c.n = n;
  c.transport = t;
  c.slice = slice;
  c.slice_stage = stage;
  const size_t count = 300001;  // odd, 1.2 MB of float32
  auto errors = run_ranks(c, [&](ddp::ProcessGroup& pg) {
    std::vector<float> v(count);
    for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>(pg.rank() + 1) + static_cast<float>(i % 13);
    pg.all_reduce(std::span<float>(v));
    float base = static_cast<float>(n * (n + 1) / 2);
    for (size_t i = 0; i < count; ++i)
      if (v[i] != base + static_cast<float>(n) * static_cast<float>(i % 13))
        throw std::runtime_error("all_reduce large: wrong value at " + std::to_string(i));
    std::vector<uint8_t> b(count * 3 + 5);
    if (pg.rank() == n - 1)
      for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(i * 31);
    pg.broadcast(std::span<uint8_t>(b), {.root = n - 1});
    for (size_t i = 0; i < b.size(); ++i)
      if (b[i] != static_cast<uint8_t>(i * 31)) throw std::runtime_error("broadcast large: wrong byte");
    std::vector<double> in(count), out(count * n);
    for (size_t i = 0; i < count; ++i) in[i] = pg.rank() * 1e6 + static_cast<double>(i);
    pg.all_gather(std::span<const double>(in), std::span<double>(out));
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < count; i += 997)
        if (out[p * count + i] != p * 1e6 + static_cast<double>(i))
          throw std::runtime_error("all_gather large: wrong value");
  });
  expect_no_errors(errors);
}

TEST(CollectivesLarge, ShmTwoRanks) { large(2, ddp::Transport::kAuto); }
TEST(CollectivesLarge, ShmThreeRanks) { large(3, ddp::Transport::kAuto); }
TEST(CollectivesLarge, TcpFourRanks) { large(4, ddp::Transport::kTcp); }
TEST(CollectivesLarge, SliceFourRanks) { large(4, ddp::Transport::kAuto, 1); }
TEST(CollectivesLarge, SliceThreeRanksOddStage) { large(3, ddp::Transport::kAuto, 1, 100000); }
// Automatic choice (slice on this host when 4 ranks outnumber its CPUs, ring otherwise).
TEST(CollectivesLarge, AutoFourRanks) {
  large(4, ddp::Transport::kAuto, ddp::ProcessGroupOptions::kAutoSlice);
}
// Never the slice algorithm across hosts, whatever the threshold says.
TEST(CollectivesLarge, SliceThresholdIgnoredAcrossHosts) {
  GroupConfig c = mixed_cfg({"A", "A", "B", "B"});
  c.slice = 1;
  c.small = 0;
  auto errors = run_ranks(c, [&](ddp::ProcessGroup& pg) {
    std::vector<int32_t> v(10007);
    for (size_t i = 0; i < v.size(); ++i) v[i] = pg.rank() + static_cast<int32_t>(i % 7);
    pg.all_reduce(std::span<int32_t>(v));
    for (size_t i = 0; i < v.size(); ++i)
      if (v[i] != 6 + 4 * static_cast<int32_t>(i % 7)) throw std::runtime_error("wrong value");
  });
  expect_no_errors(errors);
}

// Results are bitwise identical on every rank (inexact float sums included).
TEST(Collectives, BitwiseIdenticalAcrossRanks) {
  for (size_t small : {size_t{0}, size_t{64 << 10}, size_t{1}}) {
    GroupConfig c;
    c.n = 3;
    c.small = small;
    c.slice = small == 1 ? 1 : 0;  // 1: the slice algorithm
    c.slice_stage = 4096;
    std::vector<std::vector<float>> results(3);
    auto errors = run_ranks(c, [&](ddp::ProcessGroup& pg) {
      std::vector<float> v(5000);
      for (size_t i = 0; i < v.size(); ++i) v[i] = 1.0f / static_cast<float>(i + 1 + pg.rank() * 3);
      pg.all_reduce(std::span<float>(v), {.op = ReduceOp::kAvg});
      results[pg.rank()] = v;
    });
    expect_no_errors(errors);
    EXPECT_EQ(std::memcmp(results[0].data(), results[1].data(), results[0].size() * 4), 0);
    EXPECT_EQ(std::memcmp(results[0].data(), results[2].data(), results[0].size() * 4), 0);
  }
}

// An average of float16 values near its largest (65504) is as large as they are, on every
// algorithm: each rank's values are scaled by 1/n before the sum, as NCCL does (their sum
// would overflow to inf). The input of a reduce-scatter, the caller's, is left as it was.
TEST(Collectives, AFloat16AverageDoesNotOverflowWhereItsSumWould) {
  GroupConfig tcp = ring_cfg(4, ddp::Transport::kTcp), shm = ring_cfg(4, ddp::Transport::kAuto);
  for (const GroupConfig& c : {flat_cfg(4), shm, tcp, slice_cfg(4)}) {
    auto errors = run_ranks(c, [&](ddp::ProcessGroup& pg) {
      const size_t count = 1001;
      // 59904 .. 56832 (sum 233472); a quarter of each, and every partial sum of those,
      // is a multiple of 32: exact in float16 in any order
      const double big = 59904 - 1024.0 * pg.rank();
      const double want = 59904 - 1024.0 * 1.5;
      std::vector<ddp::Half> v(count), in(count * 4), out(count);
      for (size_t i = 0; i < count; ++i) put(DType::kFloat16, v.data(), i, big);
      for (size_t i = 0; i < in.size(); ++i) put(DType::kFloat16, in.data(), i, big);
      const std::vector<ddp::Half> in_before = in;
      pg.all_reduce(v.data(), count, DType::kFloat16, {.op = ReduceOp::kAvg});
      pg.reduce_scatter(in.data(), out.data(), count, DType::kFloat16, {.op = ReduceOp::kAvg});
      for (size_t i = 0; i < count; ++i) {
        if (get(DType::kFloat16, v.data(), i) != want)
          throw std::runtime_error(fmt::format("all_reduce avg [{}] = {}, want {}", i,
                                               get(DType::kFloat16, v.data(), i), want));
        if (get(DType::kFloat16, out.data(), i) != want)
          throw std::runtime_error(fmt::format("reduce_scatter avg [{}] = {}, want {}", i,
                                               get(DType::kFloat16, out.data(), i), want));
      }
      if (std::memcmp(in.data(), in_before.data(), in.size() * sizeof(ddp::Half)) != 0)
        throw std::runtime_error("reduce_scatter avg changed its input");
    });
    expect_no_errors(errors);
  }
}

// 16-bit float reductions give what ddp::Half's and ddp::BFloat16's own conversions give
// (the CPU's F16C or AVX2 instructions do the work where it has them): every bit pattern
// through a max against -inf, and the sums of random pairs (subnormals, ties, overflow to
// inf among them).
template <class H>
void reduces_as_its_type_rounds(DType t) {
  GroupConfig c = ring_cfg(2, ddp::Transport::kAuto);
  const size_t all = 65536;
  auto errors = run_ranks(c, [&](ddp::ProcessGroup& pg) {
    const bool first = pg.rank() == 0;
    const H minus_inf = H::from_float(-std::numeric_limits<float>::infinity());
    std::vector<H> v(all);
    for (size_t i = 0; i < all; ++i) v[i] = first ? H{static_cast<uint16_t>(i)} : minus_inf;
    pg.all_reduce(v.data(), all, t, {.op = ReduceOp::kMax});
    for (size_t i = 0; i < all; ++i) {
      const H want{static_cast<uint16_t>(i)};
      const bool nan = std::isnan(want.to_float());
      if (nan ? !std::isnan(v[i].to_float()) : !(v[i] == want))
        throw std::runtime_error(fmt::format("{}: max(0x{:04x}, -inf) = 0x{:04x}", ddp::dtype_name(t), i, v[i].bits));
    }
    std::vector<H> x(all), y(all), sum(all);
    uint32_t seed = 12345;
    auto next = [&] { return seed = seed * 1664525u + 1013904223u; };
    const uint16_t exponent = std::is_same_v<H, ddp::Half> ? 0xfc00u : 0xff80u;
    for (size_t i = 0; i < all; ++i) {
      x[i] = H{static_cast<uint16_t>(next() >> 16)};
      y[i] = H{static_cast<uint16_t>(next() >> 16)};
      if (i % 4 == 0) y[i] = H{static_cast<uint16_t>((x[i].bits & exponent) | ((next() >> 16) & ~exponent & 0x7fffu))};
      sum[i] = first ? x[i] : y[i];
    }
    pg.all_reduce(sum.data(), all, t, {.op = ReduceOp::kSum});
    for (size_t i = 0; i < all; ++i) {
      const H want = H::from_float(x[i].to_float() + y[i].to_float());
      const bool nan = std::isnan(want.to_float());
      if (nan ? !std::isnan(sum[i].to_float()) : !(sum[i] == want))
        throw std::runtime_error(fmt::format("{}: 0x{:04x} + 0x{:04x} = 0x{:04x}, want 0x{:04x}", ddp::dtype_name(t),
                                             x[i].bits, y[i].bits, sum[i].bits, want.bits));
    }
  });
  expect_no_errors(errors);
}

TEST(Collectives, Float16ReductionsRoundAsHalfDoes) { reduces_as_its_type_rounds<ddp::Half>(DType::kFloat16); }
TEST(Collectives, BFloat16ReductionsRoundAsBFloat16Does) {
  reduces_as_its_type_rounds<ddp::BFloat16>(DType::kBFloat16);
}

TEST(Collectives, ManyGroupsAndInterleavedAlgorithms) {
  GroupConfig c;
  c.n = 4;
  auto errors = run_ranks(c, [&](ddp::ProcessGroup& pg) {
    for (int it = 0; it < 200; ++it) {
      std::vector<int64_t> v(it % 3 == 0 ? 20000 : 3, pg.rank());
      pg.all_reduce(std::span<int64_t>(v), {.op = ReduceOp::kMax});
      for (auto x : v)
        if (x != 3) throw std::runtime_error("wrong max at iteration " + std::to_string(it));
      if (it % 10 == 0) pg.barrier();
    }
  });
  expect_no_errors(errors);
}

// Min and max propagate a NaN whichever rank holds it (before: held by rank 0 it stayed, by
// rank 2 it vanished), for small (flat) and large messages, over shared memory and TCP.
TEST(Collectives, MinAndMaxPropagateANaNFromAnyRank) {
  for (auto transport : {ddp::Transport::kAuto, ddp::Transport::kTcp})
    for (size_t count : {size_t{5}, size_t{100000}}) {
      GroupConfig c;
      c.n = 3;
      c.transport = transport;
      auto errors = run_ranks(c, [&](ddp::ProcessGroup& pg) {
        for (int holder = 0; holder < 3; ++holder)
          for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
            std::vector<float> f(count, static_cast<float>(pg.rank()));
            std::vector<double> d(count, pg.rank());
            if (pg.rank() == holder) f[count / 2] = d[count / 2] = std::numeric_limits<double>::quiet_NaN();
            pg.all_reduce(std::span<float>(f), {.op = op});
            pg.all_reduce(std::span<double>(d), {.op = op});
            if (!std::isnan(f[count / 2]) || !std::isnan(d[count / 2]))
              throw std::runtime_error(fmt::format("{} of {} elements, NaN on rank {}: {} / {}",
                                                   op == ReduceOp::kMin ? "min" : "max", count, holder,
                                                   f[count / 2], d[count / 2]));
            if (f[0] != (op == ReduceOp::kMin ? 0.0f : 2.0f)) throw std::runtime_error("a number is wrong");
          }
      });
      expect_no_errors(errors);
    }
}

// A group made again under the same name, after the last was destroyed (torch allows it):
// before, it read the last one's keys (its shared memory segment's name, its ports) and
// failed at once (shared memory) or waited out its timeout (TCP).
TEST(Collectives, AGroupMadeAgainUnderTheSameNameWorks) {
  for (auto transport : {ddp::Transport::kAuto, ddp::Transport::kTcp}) {
    GroupConfig c;
    c.n = 3;
    c.transport = transport;
    c.timeout = ddp::test::scaled(std::chrono::seconds(10));
    auto store = std::make_shared<ddp::MemoryStore>();
    for (int round = 0; round < 3; ++round) {
      auto errors = run_ranks_with(
          c.n, [&](int r, std::shared_ptr<ddp::Store> s) { return options_for(c, r, std::move(s)); },
          [&](ddp::ProcessGroup& pg) {
            std::vector<int64_t> v(1000, pg.rank() + round);
            pg.all_reduce(std::span<int64_t>(v));
            if (v[999] != 3 + 3 * round) throw std::runtime_error("wrong sum " + std::to_string(v[999]));
          },
          store);
      expect_no_errors(errors);
    }
  }
}

// A timeout of milliseconds::max() means no deadline (before: now + max overflowed into the
// past, and the group failed at once); a negative one is a usage error, not the default.
TEST(Collectives, TheLongestTimeoutWaitsAndANegativeOneIsRefused) {
  GroupConfig c;
  c.n = 2;
  c.timeout = std::chrono::milliseconds::max();
  auto errors = run_ranks(c, [&](ddp::ProcessGroup& pg) {
    std::vector<float> v(10, 1.0f);
    pg.all_reduce(std::span<float>(v), {.timeout = std::chrono::milliseconds::max()});
    if (v[0] != 2.0f) throw std::runtime_error("wrong sum");
    try {
      pg.all_reduce(std::span<float>(v), {.timeout = std::chrono::milliseconds(-5)});
      throw std::runtime_error("a timeout of -5 ms was taken");
    } catch (const ddp::UsageError& e) {
      if (std::string(e.what()).find("a timeout of -5 ms") == std::string::npos) throw;
    }
    pg.barrier();  // still usable
  });
  expect_no_errors(errors);
}

TEST(Collectives, SingleRankNeedsNoStore) {
  ddp::ProcessGroupOptions o;
  o.rank = 0;
  o.world_size = 1;
  auto pg = ddp::init_process_group(o);
  std::vector<float> v{1, 2, 3};
  pg->all_reduce(std::span<float>(v), {.op = ReduceOp::kAvg});
  EXPECT_EQ(v, (std::vector<float>{1, 2, 3}));
  std::vector<float> out(3);
  pg->reduce_scatter(std::span<const float>(v), std::span<float>(out));
  EXPECT_EQ(out, v);
  pg->barrier();
}

TEST(Collectives, BadArgumentsAreReported) {
  ddp::ProcessGroupOptions bad;
  bad.rank = 2;
  bad.world_size = 2;
  EXPECT_THROW(ddp::init_process_group(bad), ddp::UsageError);
  bad.rank = 0;
  EXPECT_THROW(ddp::init_process_group(bad), ddp::UsageError);  // no store
  ddp::ProcessGroupOptions o;
  o.rank = 0;
  o.world_size = 1;
  auto pg = ddp::init_process_group(o);
  float x = 0;
  try {
    pg->broadcast(&x, 1, DType::kFloat32, {.root = 3});
    FAIL() << "no exception";
  } catch (const ddp::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("root 3"), std::string::npos) << e.what();
  }
  std::vector<float> in(4), out(3);
  EXPECT_THROW(pg->reduce_scatter(std::span<const float>(in), std::span<float>(out)), ddp::UsageError);
}

// Bad arguments are refused before anything is sent, as UsageError, naming the bad value;
// the group stays usable (before: an unknown dtype failed inside the collective, after
// communicating, and made the group unusable; a count whose bytes overflow crashed).
TEST(Collectives, BadArgumentsLeaveTheGroupUsable) {
  GroupConfig c;
  c.n = 2;
  auto errors = run_ranks(c, [&](ddp::ProcessGroup& pg) {
    std::vector<float> v(10, 1.0f), out(20);
    auto refused = [&](const char* what, const std::function<void()>& call, const std::string& says) {
      try {
        call();
      } catch (const ddp::UsageError& e) {
        if (std::string(e.what()).find(says) != std::string::npos) return;
        throw std::runtime_error(std::string(what) + ": " + e.what());
      }
      throw std::runtime_error(std::string(what) + ": not refused");
    };
    refused("dtype", [&] { pg.all_reduce(v.data(), v.size(), static_cast<DType>(42)); }, "unknown dtype 42");
    refused("op", [&] { pg.all_reduce(std::span<float>(v), {.op = static_cast<ReduceOp>(9)}); }, "unknown reduce op 9");
    refused("rs op", [&] { pg.reduce_scatter(std::span<const float>(out), std::span<float>(v), {.op = static_cast<ReduceOp>(9)}); },
            "unknown reduce op 9");
    refused("overflow", [&] { pg.all_reduce(v.data(), SIZE_MAX / 2, DType::kFloat32); }, "do not fit in memory");
    // 4 PiB: no overflow, but more than any process can address (it crashed every rank).
    refused("beyond memory", [&] { pg.all_reduce(v.data(), size_t(1) << 50, DType::kFloat32); },
            "do not fit in memory");
    refused("gather overflow", [&] { pg.all_gather(v.data(), out.data(), SIZE_MAX / 4, DType::kFloat32); },
            "do not fit in memory");
    refused("null", [&] { pg.all_reduce(nullptr, 3, DType::kFloat32); }, "null buffer");
    refused("root", [&] { pg.broadcast(std::span<float>(v), {.root = 2}); }, "root 2 is not a rank");
    refused("sizes", [&] { pg.all_gather(std::span<float>(v), std::span<float>(v)); }, "buffer sizes disagree");
    // Still usable: and the mutable-span all_gather / reduce_scatter compile and work.
    pg.all_reduce(std::span<float>(v));
    if (v[0] != 2.0f) throw std::runtime_error("wrong sum after refused calls");
    pg.all_gather(std::span<float>(v), std::span<float>(out));
    pg.reduce_scatter(std::span<float>(out), std::span<float>(v));
    if (v[0] != 4.0f) throw std::runtime_error("wrong reduce_scatter");
  });
  expect_no_errors(errors);
}

// A group is used by one thread at a time: a second thread's call while the first is in
// progress is refused (before: both ran on the same links, tore each other's results,
// then hung until the timeout); the first completes.
TEST(Collectives, ASecondThreadsCallIsRefusedAndTheFirstCompletes) {
  GroupConfig c;
  c.n = 2;
  auto errors = run_ranks(c, [&](ddp::ProcessGroup& pg) {
    std::vector<float> v(1000, 1.0f), w(1000, 100.0f);
    if (pg.rank() == 1) {
      std::this_thread::sleep_for(ddp::test::scaled(std::chrono::milliseconds(500)));  // rank 0's first call waits for it
      pg.all_reduce(std::span<float>(v));
      if (v[0] != 2.0f) throw std::runtime_error("rank 1: wrong sum");
      return;
    }
    std::thread first([&] { pg.all_reduce(std::span<float>(v)); });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::string second;
    try {
      pg.all_reduce(std::span<float>(w));
      second = "not refused";
    } catch (const ddp::UsageError& e) {
      if (std::string(e.what()).find("another thread's call") == std::string::npos) second = e.what();
    }
    first.join();
    if (!second.empty()) throw std::runtime_error("rank 0, second thread: " + second);
    if (v[0] != 2.0f || w[0] != 100.0f) throw std::runtime_error("rank 0: wrong results");
  });
  expect_no_errors(errors);
}

}  // namespace
