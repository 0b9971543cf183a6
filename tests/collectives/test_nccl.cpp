// NCCL backend (ctest label "gpu"). Every test skips cleanly where no GPU is visible; ranks
// are threads, one per device (NCCL allows one rank per device in a communicator).
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>

#include "ddp/ddp.hpp"
#include "harness.hpp"

using namespace std::chrono_literals;

namespace {

int gpus() { return ddp::cuda_device_count(); }

#define REQUIRE_GPU()                                                              \
  do {                                                                             \
    if (gpus() == 0) GTEST_SKIP() << "no CUDA device visible: NCCL tests skipped"; \
  } while (0)

// Runs fn on one thread per rank (world = min(devices, 4)), each with its own group.
void run_nccl(int world, const std::function<void(ddp::ProcessGroup&)>& fn) {
  auto errors = ddp_test::run_ranks_with(
      world,
      [&](int r, std::shared_ptr<ddp::Store> store) {
        ddp::ProcessGroupOptions o;
        o.rank = r;
        o.world_size = world;
        o.store = std::move(store);
        o.backend = ddp::Backend::kNccl;
        o.device = r;
        o.timeout = ddp::test::scaled(60s);  // a hang guard
        return o;
      },
      fn);
  ddp_test::expect_no_errors(errors);
}

int world() { return std::min(gpus(), 4); }

TEST(Nccl, ReportsMissingGpuOrBuild) {
  if (gpus() > 0) GTEST_SKIP() << "a GPU is present (covered by the other tests)";
  ddp::ProcessGroupOptions o;
  o.rank = 0;
  o.world_size = 1;
  o.backend = ddp::Backend::kNccl;
  try {
    ddp::init_process_group(o);
    FAIL() << "no exception";
  } catch (const ddp::CollectiveError& e) {
    std::string w = e.what();
    EXPECT_TRUE(w.find("no CUDA device") != std::string::npos ||
                w.find("without CUDA/NCCL") != std::string::npos)
        << w;
  }
}

TEST(Nccl, AllReduceSumAndAvg) {
  REQUIRE_GPU();
  const int n = world();
  run_nccl(n, [&](ddp::ProcessGroup& pg) {
    const size_t count = 1 << 20;
    std::vector<float> h(count);
    for (size_t i = 0; i < count; ++i) h[i] = static_cast<float>(pg.rank() + 1) + static_cast<float>(i % 7);
    ddp::DeviceBuffer d(count * 4, pg.rank());
    d.copy_from_host(h.data(), count * 4);
    pg.all_reduce(d.data(), count, ddp::DType::kFloat32);
    d.copy_to_host(h.data(), count * 4);
    float base = static_cast<float>(n * (n + 1) / 2);
    for (size_t i = 0; i < count; i += 1013)
      if (h[i] != base + static_cast<float>(n) * static_cast<float>(i % 7))
        throw std::runtime_error("wrong sum at " + std::to_string(i));
    std::vector<ddp::BFloat16> b(1000, ddp::BFloat16::from_float(static_cast<float>(pg.rank())));
    ddp::DeviceBuffer db(b.size() * 2, pg.rank());
    db.copy_from_host(b.data(), b.size() * 2);
    pg.all_reduce(db.data(), b.size(), ddp::DType::kBFloat16, {.op = ddp::ReduceOp::kAvg});
    db.copy_to_host(b.data(), b.size() * 2);
    float want = static_cast<float>(n - 1) / 2.0f;
    if (std::abs(b[0].to_float() - want) > 1e-2f) throw std::runtime_error("wrong bf16 avg");
  });
}

TEST(Nccl, BroadcastAllGatherReduceScatterBarrier) {
  REQUIRE_GPU();
  const int n = world();
  run_nccl(n, [&](ddp::ProcessGroup& pg) {
    const size_t count = 4097;
    std::vector<int32_t> h(count * n);
    for (size_t i = 0; i < count; ++i) h[i] = pg.rank() == 0 ? static_cast<int32_t>(i) : -1;
    ddp::DeviceBuffer d(count * n * 4, pg.rank()), o(count * n * 4, pg.rank());
    d.copy_from_host(h.data(), count * 4);
    pg.broadcast(d.data(), count, ddp::DType::kInt32, {.root = 0});
    d.copy_to_host(h.data(), count * 4);
    for (size_t i = 0; i < count; ++i)
      if (h[i] != static_cast<int32_t>(i)) throw std::runtime_error("broadcast");
    std::vector<int32_t> mine(count, pg.rank());
    d.copy_from_host(mine.data(), count * 4);
    pg.all_gather(d.data(), o.data(), count, ddp::DType::kInt32);
    o.copy_to_host(h.data(), count * n * 4);
    for (int p = 0; p < n; ++p)
      if (h[p * count + 5] != p) throw std::runtime_error("all_gather");
    std::vector<int32_t> ones(count * n, 1);
    d.copy_from_host(ones.data(), count * n * 4);
    pg.reduce_scatter(d.data(), o.data(), count, ddp::DType::kInt32);
    o.copy_to_host(h.data(), count * 4);
    if (h[0] != n || h[count - 1] != n) throw std::runtime_error("reduce_scatter");
    pg.barrier();
  });
}

TEST(Nccl, MissingPeerTimesOutInsteadOfHanging) {
  REQUIRE_GPU();  // one GPU is enough: rank 1 never joins, so no GPU is shared
  auto store = std::make_shared<ddp::MemoryStore>();
  ddp::ProcessGroupOptions o;
  o.rank = 0;
  o.world_size = 2;
  o.store = store;
  o.backend = ddp::Backend::kNccl;
  o.device = 0;
  o.timeout = 2s;
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(ddp::init_process_group(o), ddp::TimeoutError);
  // At the 2 s timeout, or a little later (CUDA's first initialisation): far from a hang.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, ddp::test::scaled(30s));
}

}  // namespace
