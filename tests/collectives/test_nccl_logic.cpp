// The NCCL backend's logic, run against the scripted CUDA/NCCL double (fake_cuda_nccl.hpp)
// instead of a GPU: results of every collective, the unique id's trip through the store,
// non-blocking init and polling, the deadline abort when a peer is missing, asynchronous and
// immediate errors, checked CUDA calls, and what is released on a clean and a failed exit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ddp/ddp.hpp"
#include "fake_cuda_nccl.hpp"
#include "harness.hpp"

using namespace std::chrono_literals;
using ::testing::HasSubstr;

namespace {

using Clock = std::chrono::steady_clock;
using ddp::test::scaled;

// How long a rank waits for its peers unless a test sets the deadline: what a missing
// failure propagation would cost, far above every "at once" bound below.
ddp::ProcessGroupOptions nccl_options(int rank, int world, std::shared_ptr<ddp::Store> store,
                                      std::chrono::milliseconds timeout = scaled(60s)) {
  ddp::ProcessGroupOptions o;
  o.rank = rank;
  o.world_size = world;
  o.local_rank = rank;
  o.store = std::move(store);
  o.backend = ddp::Backend::kNccl;
  o.timeout = timeout;
  return o;
}

// One thread per rank, each with its own group; returns each rank's error text ("" if none).
std::vector<std::string> run_ranks(int world, const std::function<void(ddp::ProcessGroup&)>& fn,
                                   std::shared_ptr<ddp::MemoryStore> store = nullptr) {
  if (!store) store = std::make_shared<ddp::MemoryStore>();
  return ddp_test::run_ranks_with(
      world, [&](int r, std::shared_ptr<ddp::Store> s) { return nccl_options(r, world, std::move(s)); },
      fn, store);
}

// Every communicator, stream and allocation was released, and nothing was misused.
void expect_clean(const fake::Counters& c) {
  EXPECT_EQ(c.live_comms, 0);
  EXPECT_EQ(c.live_streams, 0);
  EXPECT_EQ(c.live_allocations, 0);
  EXPECT_TRUE(c.all_non_blocking);
  for (const auto& m : c.misuse) ADD_FAILURE() << "misuse: " << m;
}

// Host values -> device buffer and back.
template <class T>
ddp::DeviceBuffer to_device(const std::vector<T>& v, int device) {
  ddp::DeviceBuffer b(v.size() * sizeof(T), device);
  b.copy_from_host(v.data(), v.size() * sizeof(T));
  return b;
}
template <class T>
std::vector<T> to_host(const ddp::DeviceBuffer& b) {
  std::vector<T> v(b.size() / sizeof(T));
  b.copy_to_host(v.data(), b.size());
  return v;
}

class NcclLogic : public ::testing::Test {
 protected:
  void SetUp() override { fake::reset(); }
  void TearDown() override { fake::reset(); }
};

TEST_F(NcclLogic, EveryCollectiveIsCorrectOnFourRanksAndShutsDownCleanly) {
  fake::Script s;
  s.device_count = 4;
  fake::reset(s);
  constexpr int kWorld = 4;
  constexpr size_t kCount = 1000;
  auto errors = run_ranks(kWorld, [](ddp::ProcessGroup& pg) {
    const int r = pg.rank(), n = pg.size();
    for (ddp::DType t : {ddp::DType::kFloat32, ddp::DType::kFloat64, ddp::DType::kFloat16,
                         ddp::DType::kBFloat16, ddp::DType::kInt32, ddp::DType::kInt64,
                         ddp::DType::kUInt8})
      for (ddp::ReduceOp op : {ddp::ReduceOp::kSum, ddp::ReduceOp::kProd, ddp::ReduceOp::kMin,
                               ddp::ReduceOp::kMax, ddp::ReduceOp::kAvg}) {
        const size_t es = ddp::dtype_size(t);
        std::vector<uint8_t> host(kCount * es);
        for (size_t i = 0; i < kCount; ++i) ddp_test::put(t, host.data(), i, (i + r) % 3 + 1);
        auto dev = to_device(host, r);
        pg.all_reduce(dev.data(), kCount, t, {.op = op});
        auto got = to_host<uint8_t>(dev);
        for (size_t i = 0; i < kCount; ++i) {
          double sum = 0, prod = 1, mn = 1e9, mx = -1e9;
          for (int q = 0; q < n; ++q) {
            double v = (i + q) % 3 + 1;
            sum += v, prod *= v, mn = std::min(mn, v), mx = std::max(mx, v);
          }
          double want = op == ddp::ReduceOp::kSum    ? sum
                        : op == ddp::ReduceOp::kProd ? prod
                        : op == ddp::ReduceOp::kMin  ? mn
                        : op == ddp::ReduceOp::kMax  ? mx
                                                     : sum / n;
          const bool integral = t == ddp::DType::kInt32 || t == ddp::DType::kInt64 ||
                                t == ddp::DType::kUInt8;
          if (op == ddp::ReduceOp::kAvg && integral) want = static_cast<int>(want);
          ASSERT_NEAR(ddp_test::get(t, got.data(), i), want, 0.02 * want)
              << "rank " << r << " dtype " << ddp::dtype_name(t) << " op " << static_cast<int>(op)
              << " element " << i;
        }
      }
    // broadcast from rank 2, all_gather, reduce_scatter, barrier (float32).
    std::vector<float> mine(kCount);
    for (size_t i = 0; i < kCount; ++i) mine[i] = static_cast<float>(r * 10000 + i);
    auto b = to_device(mine, r);
    pg.broadcast(b.data(), kCount, ddp::DType::kFloat32, {.root = 2});
    auto bh = to_host<float>(b);
    for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(bh[i], static_cast<float>(20000 + i));

    auto in = to_device(mine, r);
    ddp::DeviceBuffer out(kCount * n * sizeof(float), r);
    pg.all_gather(in.data(), out.data(), kCount, ddp::DType::kFloat32);
    auto gh = to_host<float>(out);
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(gh[q * kCount + i], static_cast<float>(q * 10000 + i));

    std::vector<float> blocks(kCount * n);
    for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<float>(i + r);
    auto rin = to_device(blocks, r);
    ddp::DeviceBuffer rout(kCount * sizeof(float), r);
    pg.reduce_scatter(rin.data(), rout.data(), kCount, ddp::DType::kFloat32);
    auto rh = to_host<float>(rout);
    for (size_t i = 0; i < kCount; ++i) {
      double idx = static_cast<double>(r * kCount + i);
      ASSERT_EQ(rh[i], static_cast<float>(n * idx + (0 + 1 + 2 + 3)));
    }
    pg.barrier();
  });
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  auto c = fake::counters();
  EXPECT_EQ(c.inits, kWorld);
  EXPECT_EQ(c.finalizes, kWorld);
  EXPECT_EQ(c.destroys, kWorld);
  EXPECT_EQ(c.aborts, 0);
  std::vector<int> devices = c.comm_devices;
  std::sort(devices.begin(), devices.end());
  EXPECT_EQ(devices, (std::vector<int>{0, 1, 2, 3}));
  expect_clean(c);
}

// DeviceBuffer's bad input: a clear error of libddp's own, not CUDA's (which, with no GPU
// at all, names a driver version); empty buffers' copies and fills do nothing.
TEST_F(NcclLogic, DeviceBufferChecksItsDeviceAndRanges) {
  auto what = [](auto&& f) {
    try {
      f();
    } catch (const ddp::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  fake::Script none;
  none.device_count = 0;
  fake::reset(none);
  EXPECT_EQ(what([] { ddp::DeviceBuffer b(64, 0); }),
            "DeviceBuffer: no CUDA device is visible (cudaGetDeviceCount returned 0 or failed)");
  fake::reset();  // one device
  EXPECT_THROW(ddp::DeviceBuffer(64, -1), ddp::UsageError);
  EXPECT_EQ(what([] { ddp::DeviceBuffer b(64, 1); }), "DeviceBuffer: device 1, but 1 CUDA device is visible");
  ddp::DeviceBuffer b(64, 0);
  char host[80] = {};
  EXPECT_EQ(what([&] { b.copy_from_host(host, 80); }),
            "DeviceBuffer::copy_from_host: 80 bytes at offset 0 do not fit in the buffer's 64 bytes");
  EXPECT_THROW(b.copy_to_host(host, 8, SIZE_MAX - 4), ddp::UsageError);  // (offset + n wraps)
  ddp::DeviceBuffer empty;
  EXPECT_NO_THROW(empty.fill_zero());
  EXPECT_NO_THROW(empty.copy_to_host(host, 0));
  EXPECT_NO_THROW(empty.copy_from_host(host, 0));
}

TEST_F(NcclLogic, MapsEveryDtypeAndOpToNccl) {
  auto errors = run_ranks(1, [](ddp::ProcessGroup& pg) {
    ddp::DeviceBuffer b(64, 0);
    for (ddp::DType t : {ddp::DType::kFloat32, ddp::DType::kFloat64, ddp::DType::kFloat16,
                         ddp::DType::kBFloat16, ddp::DType::kInt32, ddp::DType::kInt64,
                         ddp::DType::kUInt8})
      pg.all_reduce(b.data(), 4, t);
    for (ddp::ReduceOp op : {ddp::ReduceOp::kSum, ddp::ReduceOp::kProd, ddp::ReduceOp::kMin,
                             ddp::ReduceOp::kMax, ddp::ReduceOp::kAvg})
      pg.all_reduce(b.data(), 4, ddp::DType::kFloat32, {.op = op});
    pg.all_reduce(b.data(), 0, ddp::DType::kFloat32);  // nothing to do: no NCCL call
  });
  EXPECT_EQ(errors[0], "");
  auto c = fake::counters();
  std::vector<ncclDataType_t> types(c.types.begin(), c.types.begin() + 7);
  EXPECT_EQ(types, (std::vector<ncclDataType_t>{ncclFloat32, ncclFloat64, ncclFloat16, ncclBfloat16,
                                                ncclInt32, ncclInt64, ncclUint8}));
  ASSERT_EQ(c.ops.size(), 12u);
  std::vector<ncclRedOp_t> ops(c.ops.begin() + 7, c.ops.end());
  EXPECT_EQ(ops, (std::vector<ncclRedOp_t>{ncclSum, ncclProd, ncclMin, ncclMax, ncclAvg}));
  expect_clean(c);
}

TEST_F(NcclLogic, DeviceIsLocalRankModuloDeviceCountUnlessGiven) {
  fake::Script s;
  s.device_count = 2;
  fake::reset(s);
  auto store = std::make_shared<ddp::MemoryStore>();
  std::vector<std::string> errors(3);
  std::vector<std::thread> ts;
  // A group of two with local ranks 3 and 4 lands on devices 1 and 0; then a group of one
  // with local rank 0 and an explicit device 1 uses device 1.
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      try {
        auto o = nccl_options(r, 2, store);
        o.local_rank = 3 + r;
        ddp::init_process_group(o)->barrier();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  try {
    auto o = nccl_options(0, 1, nullptr);
    o.local_rank = 0;
    o.device = 1;
    ddp::init_process_group(o)->barrier();
  } catch (const std::exception& e) {
    errors[2] = e.what();
  }
  for (const auto& e : errors) EXPECT_EQ(e, "");
  auto c = fake::counters();
  ASSERT_EQ(c.comm_devices.size(), 3u);
  std::vector<int> pair(c.comm_devices.begin(), c.comm_devices.begin() + 2);
  std::sort(pair.begin(), pair.end());
  EXPECT_EQ(pair, (std::vector<int>{0, 1}));
  EXPECT_EQ(c.comm_devices[2], 1);
  expect_clean(c);
}

TEST_F(NcclLogic, UniqueIdGoesThroughTheStore) {
  fake::Script s;
  s.device_count = 2;
  fake::reset(s);
  auto store = std::make_shared<ddp::MemoryStore>();
  auto errors = run_ranks(2, [&](ddp::ProcessGroup& pg) { pg.barrier(); }, store);
  EXPECT_EQ(errors, (std::vector<std::string>{"", ""}));
  ASSERT_TRUE(store->check({"pg/nccl/unique_id"}));
  EXPECT_EQ(store->get("pg/nccl/unique_id").size(), sizeof(ncclUniqueId));
  expect_clean(fake::counters());
}

TEST_F(NcclLogic, MissingRankZeroTimesOutNamingTheKey) {
  fake::Script s;
  s.device_count = 2;
  fake::reset(s);
  auto o = nccl_options(1, 2, std::make_shared<ddp::MemoryStore>(), 300ms);
  auto t0 = Clock::now();
  try {
    ddp::init_process_group(o);
    FAIL() << "no exception";
  } catch (const ddp::TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("init_process_group (nccl) on rank 1 of 2 (device 1)"));
    EXPECT_THAT(e.what(), HasSubstr("pg/nccl/unique_id"));
  }
  EXPECT_LT(Clock::now() - t0, scaled(10s));  // at the 300 ms deadline, not much later
  expect_clean(fake::counters());
}

TEST_F(NcclLogic, MalformedUniqueIdIsRejected) {
  auto store = std::make_shared<ddp::MemoryStore>();
  store->set("pg/nccl/unique_id", "abc");
  fake::Script s;
  s.device_count = 2;
  fake::reset(s);
  try {
    ddp::init_process_group(nccl_options(1, 2, store));
    FAIL() << "no exception";
  } catch (const ddp::CollectiveError& e) {
    EXPECT_THAT(e.what(), HasSubstr("store key pg/nccl/unique_id holds 3 bytes, expected an "
                                    "ncclUniqueId of 128"));
  }
  expect_clean(fake::counters());
}

TEST_F(NcclLogic, InitWithAMissingPeerAbortsAtTheDeadline) {
  fake::Script s;
  s.device_count = 2;
  fake::reset(s);
  auto o = nccl_options(0, 2, std::make_shared<ddp::MemoryStore>(), 300ms);
  auto t0 = Clock::now();
  try {
    ddp::init_process_group(o);
    FAIL() << "no exception";
  } catch (const ddp::TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank 0 of 2 (device 0)"));
    EXPECT_THAT(e.what(), HasSubstr("communicator initialisation (ncclCommInitRankConfig) did "
                                    "not complete before the deadline; communicator aborted"));
  }
  auto took = Clock::now() - t0;
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, scaled(10s));  // at the deadline, not much later
  auto c = fake::counters();
  EXPECT_EQ(c.aborts, 1);
  EXPECT_EQ(c.destroys, 0);
  expect_clean(c);
}

// A rank whose initialisation fails publishes why; the others stop waiting for it at once
// (for its ncclUniqueId, or for it to join the communicator) instead of at the deadline.
TEST_F(NcclLogic, RankZeroFailingBeforeTheIdEndsTheOthersWait) {
  fake::Script s;
  s.device_count = 2;
  s.fail_cuda_malloc_device = 0;
  fake::reset(s);
  auto t0 = Clock::now();
  auto errors = run_ranks(2, [](ddp::ProcessGroup&) {});
  EXPECT_LT(Clock::now() - t0, scaled(10s));  // at once (ms), not at the deadline
  EXPECT_THAT(errors[0], HasSubstr("out of memory"));
  EXPECT_THAT(errors[1], HasSubstr("rank 1 of 2 (device 1): gave up waiting for rank 0's "
                                   "ncclUniqueId (store key pg/nccl/unique_id): another rank "
                                   "failed: ddp init_process_group (nccl) on rank 0 of 2 (device "
                                   "0): "));
  EXPECT_THAT(errors[1], HasSubstr("cudaMalloc(&scratch_, 16) failed: out of memory"));
  expect_clean(fake::counters());
}

TEST_F(NcclLogic, PeerFailingAtInitAbortsTheWaitingCommunicator) {
  fake::Script s;
  s.device_count = 2;
  s.fail_cuda_malloc_device = 1;
  fake::reset(s);
  auto store = std::make_shared<ddp::MemoryStore>();
  std::string err0, err1;
  auto t0 = Clock::now();
  std::thread rank0([&] {
    try {
      ddp::init_process_group(nccl_options(0, 2, store));
    } catch (const std::exception& e) {
      err0 = e.what();
    }
  });
  // Rank 1 starts once rank 0 waits for it inside the communicator's initialisation.
  EXPECT_TRUE(ddp::test::wait_until([] { return fake::counters().inits >= 1; }, scaled(30s)))
      << "rank 0 never began its communicator's initialisation";
  try {
    ddp::init_process_group(nccl_options(1, 2, store));
  } catch (const std::exception& e) {
    err1 = e.what();
  }
  rank0.join();
  EXPECT_LT(Clock::now() - t0, scaled(10s));  // at once (ms), not at the deadline
  EXPECT_THAT(err1, HasSubstr("out of memory"));
  EXPECT_THAT(err0, HasSubstr("rank 0 of 2 (device 0): gave up communicator initialisation "
                              "(ncclCommInitRankConfig); communicator aborted: another rank "
                              "failed: ddp init_process_group (nccl) on rank 1 of 2 (device 1)"));
  auto c = fake::counters();
  EXPECT_EQ(c.aborts, 1);
  expect_clean(c);
}

TEST_F(NcclLogic, PeerThatNeverJoinsACollectiveAbortsAtTheDeadline) {
  fake::Script s;
  s.device_count = 2;
  fake::reset(s);
  std::promise<void> rank0_done;
  auto done = rank0_done.get_future().share();
  std::string first, second;
  Clock::duration took{};
  auto errors = run_ranks(2, [&](ddp::ProcessGroup& pg) {
    if (pg.rank() == 1) {  // alive but never calls the collective
      done.wait();
      return;
    }
    ddp::DeviceBuffer b(4096, 0);
    auto t0 = Clock::now();
    try {
      pg.all_reduce(b.data(), 1024, ddp::DType::kFloat32, {.timeout = 300ms});
    } catch (const ddp::TimeoutError& e) {
      first = e.what();
    }
    took = Clock::now() - t0;
    try {
      pg.barrier();
    } catch (const ddp::CollectiveError& e) {
      second = e.what();
    }
    rank0_done.set_value();
  });
  EXPECT_EQ(errors, (std::vector<std::string>{"", ""}));
  EXPECT_THAT(first, HasSubstr("ddp all_reduce failed on rank 0 of 2: ncclAllReduce on device 0 "
                               "did not complete before the deadline; communicator aborted"));
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, scaled(10s));  // at the deadline, not much later
  EXPECT_THAT(second, HasSubstr("unusable after an earlier failure"));
  auto c = fake::counters();
  EXPECT_EQ(c.aborts, 1);    // rank 0
  EXPECT_EQ(c.destroys, 1);  // rank 1, cleanly
  expect_clean(c);
}

TEST_F(NcclLogic, AsynchronousErrorFailsTheCallAndAbortsOnce) {
  fake::Script s;
  s.async_error = ncclRemoteError;
  s.error_text = "fake: peer 3 closed the connection";
  fake::reset(s);
  std::string first, second;
  auto errors = run_ranks(1, [&](ddp::ProcessGroup& pg) {
    ddp::DeviceBuffer b(64, 0);
    try {
      pg.all_reduce(b.data(), 16, ddp::DType::kFloat32);
    } catch (const ddp::CollectiveError& e) {
      first = e.what();
    }
    EXPECT_EQ(fake::counters().aborts, 1);  // at the failure, not at destruction
    try {
      pg.all_reduce(b.data(), 16, ddp::DType::kFloat32);
    } catch (const ddp::CollectiveError& e) {
      second = e.what();
    }
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_THAT(first, HasSubstr("ddp all_reduce failed on rank 0 of 1: ncclAllReduce"));
  EXPECT_THAT(first, HasSubstr("remote process exited or there was a network error: fake: peer 3 "
                               "closed the connection"));
  EXPECT_THAT(second, HasSubstr("unusable after an earlier failure"));
  auto c = fake::counters();
  EXPECT_EQ(c.types.size(), 1u);  // the second call never reached NCCL
  EXPECT_EQ(c.aborts, 1);
  EXPECT_EQ(c.destroys, 0);
  expect_clean(c);
}

TEST_F(NcclLogic, RemoteErrorWhileWaitingOnTheStreamEndsTheWaitEarly) {
  fake::Script s;
  s.device_count = 2;
  s.async_error = ncclRemoteError;
  s.async_error_while_running = true;
  s.error_text = "fake: rank 1 exited";
  fake::reset(s);
  std::vector<std::string> errs(2);
  std::vector<Clock::duration> took(2);
  auto errors = run_ranks(2, [&](ddp::ProcessGroup& pg) {
    ddp::DeviceBuffer b(4096, pg.rank());
    auto t0 = Clock::now();
    try {
      pg.all_reduce(b.data(), 1024, ddp::DType::kFloat32, {.timeout = scaled(60s)});
    } catch (const ddp::CollectiveError& e) {
      errs[pg.rank()] = e.what();
    }
    took[pg.rank()] = Clock::now() - t0;
  });
  EXPECT_EQ(errors, (std::vector<std::string>{"", ""}));
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(errs[r], HasSubstr("ncclAllReduce failed asynchronously: remote process exited or "
                                   "there was a network error: fake: rank 1 exited"));
    // At once (ms): the bound is far from that and from the deadline.
    EXPECT_LT(took[r], scaled(10s)) << "rank " << r << " waited for the deadline instead";
  }
  auto c = fake::counters();
  EXPECT_EQ(c.aborts, 2);
  expect_clean(c);
}

TEST_F(NcclLogic, RejectedCallNamesTheCallSiteAndNcclsMessage) {
  fake::Script s;
  s.fail_enqueue = ncclInvalidArgument;
  s.error_text = "fake: count too large";
  fake::reset(s);
  std::string err;
  auto errors = run_ranks(1, [&](ddp::ProcessGroup& pg) {
    ddp::DeviceBuffer b(64, 0);
    try {
      pg.broadcast(b.data(), 16, ddp::DType::kInt32);
    } catch (const ddp::CollectiveError& e) {
      err = e.what();
    }
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_THAT(err, HasSubstr("ddp broadcast failed on rank 0 of 1: "));
  EXPECT_THAT(err, HasSubstr("nccl_group.cpp:"));
  EXPECT_THAT(err, HasSubstr("ncclBroadcast(data, data, count"));
  EXPECT_THAT(err, HasSubstr("failed: invalid argument: fake: count too large"));
  auto c = fake::counters();
  EXPECT_EQ(c.aborts, 1);
  expect_clean(c);
}

TEST_F(NcclLogic, CudaFailureNamesTheCallSiteAndCudasMessage) {
  fake::Script s;
  s.fail_cuda_malloc = true;
  fake::reset(s);
  try {
    ddp::init_process_group(nccl_options(0, 1, nullptr));
    FAIL() << "no exception";
  } catch (const ddp::CollectiveError& e) {
    EXPECT_THAT(e.what(), HasSubstr("init_process_group (nccl) on rank 0 of 1 (device 0)"));
    EXPECT_THAT(e.what(), HasSubstr("nccl_group.cpp:"));
    EXPECT_THAT(e.what(), HasSubstr("cudaMalloc(&scratch_, 16) failed: out of memory "
                                    "(cudaErrorMemoryAllocation)"));
  }
  try {
    ddp::DeviceBuffer b(1 << 20, 0);
    FAIL() << "no exception";
  } catch (const ddp::CollectiveError& e) {
    EXPECT_THAT(e.what(), HasSubstr("cudaMalloc"));
    EXPECT_THAT(e.what(), HasSubstr("out of memory"));
  }
  try {
    ddp::DeviceBuffer b(16, 5);  // (libddp's own check, before CUDA's "invalid device ordinal")
    FAIL() << "no exception";
  } catch (const ddp::UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("DeviceBuffer: device 5, but 1 CUDA device is visible"));
  }
  expect_clean(fake::counters());
}

TEST_F(NcclLogic, NoDeviceIsAClearError) {
  fake::Script s;
  s.device_count = 0;
  fake::reset(s);
  EXPECT_EQ(ddp::cuda_device_count(), 0);
  try {
    ddp::init_process_group(nccl_options(0, 1, nullptr));
    FAIL() << "no exception";
  } catch (const ddp::CollectiveError& e) {
    EXPECT_THAT(e.what(), HasSubstr("ddp init_process_group (nccl) on rank 0 of 1: no CUDA "
                                    "device is visible"));
  }
  expect_clean(fake::counters());
}

TEST_F(NcclLogic, StreamThatNeverFinishesAbortsAtTheDeadline) {
  fake::Script s;
  s.stream_polls = 1 << 30;
  fake::reset(s);
  std::string err;
  auto errors = run_ranks(1, [&](ddp::ProcessGroup& pg) {
    ddp::DeviceBuffer b(64, 0);
    try {
      pg.all_gather(b.data(), b.data(), 0, ddp::DType::kFloat32);  // count 0: returns at once
      pg.barrier({.timeout = 200ms});
    } catch (const ddp::TimeoutError& e) {
      err = e.what();
    }
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_THAT(err, HasSubstr("ddp barrier failed on rank 0 of 1: barrier (ncclAllReduce of one "
                             "byte) on device 0 did not complete before the deadline"));
  EXPECT_EQ(fake::counters().aborts, 1);
  expect_clean(fake::counters());
}

TEST_F(NcclLogic, CallersStreamIsUsedAndNotDestroyed) {
  cudaStream_t mine = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking), cudaSuccess);
  {
    auto o = nccl_options(0, 1, nullptr);
    o.cuda_stream = mine;
    auto pg = ddp::init_process_group(o);
    ddp::DeviceBuffer b(64, 0);
    pg->all_reduce(b.data(), 16, ddp::DType::kFloat32);
  }
  auto c = fake::counters();
  EXPECT_EQ(c.live_streams, 1);
  EXPECT_EQ(cudaStreamDestroy(mine), cudaSuccess);
  expect_clean(fake::counters());
}

}  // namespace
