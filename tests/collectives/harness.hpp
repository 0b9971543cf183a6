// Helpers shared by the collective tests: ranks as threads over a MemoryStore, typed
// element access by DType.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "ddp/ddp.hpp"
#include "test_timeouts.hpp"

namespace ddp_test {

inline void put(ddp::DType t, void* buf, size_t i, double v) {
  switch (t) {
    case ddp::DType::kFloat32: static_cast<float*>(buf)[i] = static_cast<float>(v); return;
    case ddp::DType::kFloat64: static_cast<double*>(buf)[i] = v; return;
    case ddp::DType::kFloat16: static_cast<ddp::Half*>(buf)[i] = ddp::Half::from_float(static_cast<float>(v)); return;
    case ddp::DType::kBFloat16: static_cast<ddp::BFloat16*>(buf)[i] = ddp::BFloat16::from_float(static_cast<float>(v)); return;
    case ddp::DType::kInt32: static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(v); return;
    case ddp::DType::kInt64: static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(v); return;
    case ddp::DType::kUInt8: static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(v); return;
  }
}

inline double get(ddp::DType t, const void* buf, size_t i) {
  switch (t) {
    case ddp::DType::kFloat32: return static_cast<const float*>(buf)[i];
    case ddp::DType::kFloat64: return static_cast<const double*>(buf)[i];
    case ddp::DType::kFloat16: return static_cast<const ddp::Half*>(buf)[i].to_float();
    case ddp::DType::kBFloat16: return static_cast<const ddp::BFloat16*>(buf)[i].to_float();
    case ddp::DType::kInt32: return static_cast<const int32_t*>(buf)[i];
    case ddp::DType::kInt64: return static_cast<const int64_t*>(buf)[i];
    case ddp::DType::kUInt8: return static_cast<const uint8_t*>(buf)[i];
  }
  return 0;
}

inline bool is_float(ddp::DType t) {
  return t == ddp::DType::kFloat32 || t == ddp::DType::kFloat64 || t == ddp::DType::kFloat16 ||
         t == ddp::DType::kBFloat16;
}

constexpr ddp::DType kAllDTypes[] = {ddp::DType::kFloat32, ddp::DType::kFloat64,
                                     ddp::DType::kFloat16, ddp::DType::kBFloat16,
                                     ddp::DType::kInt32,   ddp::DType::kInt64,
                                     ddp::DType::kUInt8};
constexpr ddp::ReduceOp kAllOps[] = {ddp::ReduceOp::kSum, ddp::ReduceOp::kProd,
                                     ddp::ReduceOp::kMin, ddp::ReduceOp::kMax,
                                     ddp::ReduceOp::kAvg};

// Input of `rank` at index i for op: small values whose reductions are exact in every dtype.
inline double input_value(ddp::ReduceOp op, ddp::DType t, int rank, size_t i) {
  switch (op) {
    case ddp::ReduceOp::kProd: return 1.0 + static_cast<double>((i + rank) % 2);
    case ddp::ReduceOp::kMin:
    case ddp::ReduceOp::kMax: {
      double v = static_cast<double>((i * 7 + static_cast<size_t>(rank) * 3) % 11);
      return t == ddp::DType::kUInt8 ? v : v - 5.0;
    }
    default: return static_cast<double>(rank + 1) + static_cast<double>(i % 5);
  }
}

inline double expected_value(ddp::ReduceOp op, ddp::DType t, int n, size_t i) {
  double acc = input_value(op, t, 0, i);
  for (int r = 1; r < n; ++r) {
    double v = input_value(op, t, r, i);
    switch (op) {
      case ddp::ReduceOp::kProd: acc *= v; break;
      case ddp::ReduceOp::kMin: acc = std::min(acc, v); break;
      case ddp::ReduceOp::kMax: acc = std::max(acc, v); break;
      default: acc += v;
    }
  }
  if (op == ddp::ReduceOp::kAvg) acc = is_float(t) ? acc / n : static_cast<double>(static_cast<int64_t>(acc) / n);
  return acc;
}

inline bool close_enough(ddp::ReduceOp op, ddp::DType t, double got, double want) {
  if (op != ddp::ReduceOp::kAvg || !is_float(t)) return got == want;
  double tol = (t == ddp::DType::kFloat16 || t == ddp::DType::kBFloat16) ? 1e-2 : 1e-6;
  return std::abs(got - want) <= tol * std::max(1.0, std::abs(want));
}

struct GroupConfig {
  int n = 2;
  ddp::Transport transport = ddp::Transport::kAuto;
  size_t small = 64 << 10;
  size_t chunk = 128 << 10;
  size_t ring = 2 << 20;
  size_t slice = ddp::ProcessGroupOptions::kAutoSlice;  // slice all-reduce threshold
  size_t slice_stage = 1 << 20;
  std::chrono::milliseconds timeout = ddp::test::scaled(std::chrono::seconds(30));  // a hang guard
  std::vector<std::string> host_ids;  // per rank (simulated hosts); empty: the real one
};

inline ddp::ProcessGroupOptions options_for(const GroupConfig& c, int rank,
                                            std::shared_ptr<ddp::Store> store) {
  ddp::ProcessGroupOptions o;
  o.rank = rank;
  o.world_size = c.n;
  o.store = std::move(store);
  o.transport = c.transport;
  o.small_message_bytes = c.small;
  o.chunk_bytes = c.chunk;
  o.shm_ring_bytes = c.ring;
  o.slice_min_bytes = c.slice;
  o.slice_stage_bytes = c.slice_stage;
  o.timeout = c.timeout;
  if (!c.host_ids.empty()) o.host_id = c.host_ids.at(rank);
  return o;
}

// Runs fn(group) on n threads (one rank each), each group made from options(rank, store)
// over one shared store; returns each rank's exception text ("" if none).
inline std::vector<std::string> run_ranks_with(
    int n, const std::function<ddp::ProcessGroupOptions(int, std::shared_ptr<ddp::Store>)>& options,
    const std::function<void(ddp::ProcessGroup&)>& fn,
    std::shared_ptr<ddp::Store> store = std::make_shared<ddp::MemoryStore>()) {
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        auto pg = ddp::init_process_group(options(r, store));
        fn(*pg);
      } catch (const std::exception& e) {
        errors[r] = e.what();
        if (errors[r].empty()) errors[r] = "(empty exception)";
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

// The same for a GroupConfig (CPU backend).
inline std::vector<std::string> run_ranks(const GroupConfig& c,
                                          const std::function<void(ddp::ProcessGroup&)>& fn) {
  return run_ranks_with(
      c.n, [&](int r, std::shared_ptr<ddp::Store> store) { return options_for(c, r, std::move(store)); },
      fn);
}

inline void expect_no_errors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

}  // namespace ddp_test
