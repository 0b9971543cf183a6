// The CPU backend's call check (src/collectives/cpu/call_check.*): a collective call that
// differs between ranks (another collective, count, dtype, op or root, or one rank a call
// ahead) fails on every rank, quickly, naming both calls, on every algorithm and transport;
// before it, such calls paired silently, and every later call of the group was wrong too.
#include <atomic>
#include <chrono>
#include <limits>

#include "harness.hpp"

using namespace ddp_test;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

// Where a call goes: the flat algorithm (small, one host), the shared-memory ring, the
// slice all-reduce, TCP.
enum class Path { kFlat, kShmRing, kSlice, kTcp };

GroupConfig config(Path p, int n) {
  GroupConfig c;
  c.n = n;
  c.slice = p == Path::kSlice ? 1 : 0;
  if (p == Path::kTcp) c.transport = ddp::Transport::kTcp;
  return c;
}

size_t count_for(Path p) { return p == Path::kFlat ? 1000 : 100000; }

// How the mismatched call may end on a rank whose own neighbour agreed with it.
enum class Ends {
  kInTheCall,      // every rank's mismatched call throws (no rank goes on with a wrong result)
  kByTheNextCall,  // broadcast: a rank whose chain from its root agreed may return (with that
                   // root's data) and fail at its next call
};

// Every rank makes one good all_reduce, then `odd(rank)` (the mismatched call), then another
// all_reduce. Every rank must throw (in the call itself unless `ends` allows otherwise), well
// before the group's 30 s timeout, and some rank's error must quote `want`.
void expect_caught(const GroupConfig& c, size_t count, const std::function<void(ddp::ProcessGroup&, size_t)>& odd,
                   const std::vector<std::string>& want, Ends ends = Ends::kInTheCall) {
  const int n = c.n;
  std::vector<int> odd_returned(n, 0);
  auto t0 = Clock::now();
  auto errors = run_ranks(c, [&](ddp::ProcessGroup& pg) {
    std::vector<float> v(count, 1.0f);
    pg.all_reduce(std::span<float>(v));
    odd(pg, count);
    odd_returned[pg.rank()] = 1;
    pg.all_reduce(std::span<float>(v));
  });
  double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  std::string all;
  for (int r = 0; r < n; ++r) {
    EXPECT_NE(errors[r], "") << "rank " << r << " went on after a mismatched call";
    if (ends == Ends::kInTheCall) {
      EXPECT_FALSE(odd_returned[r]) << "rank " << r << "'s mismatched call returned";
    }
    all += errors[r] + "\n";
  }
  for (auto& w : want) EXPECT_TRUE(contains(all, w)) << "no error quotes '" << w << "':\n" << all;
  EXPECT_TRUE(contains(all, "every rank must make the same collective calls")) << all;
  EXPECT_FALSE(contains(all, "timed out")) << all;
  EXPECT_LT(elapsed, ddp::test::scaled_seconds(10)) << all;
}

void expect_caught(Path p, int n, const std::function<void(ddp::ProcessGroup&, size_t)>& odd,
                   const std::vector<std::string>& want, Ends ends = Ends::kInTheCall) {
  expect_caught(config(p, n), count_for(p), odd, want, ends);
}

const Path kPaths[] = {Path::kFlat, Path::kShmRing, Path::kSlice, Path::kTcp};
const char* name(Path p) {
  switch (p) {
    case Path::kFlat: return "flat";
    case Path::kShmRing: return "shm ring";
    case Path::kSlice: return "slice";
    case Path::kTcp: return "tcp";
  }
  return "?";
}

}  // namespace

TEST(CallCheck, CountsThatDifferByOneElement) {
  for (Path p : kPaths) {
    SCOPED_TRACE(name(p));
    expect_caught(p, p == Path::kSlice ? 4 : 2, [](ddp::ProcessGroup& pg, size_t count) {
      std::vector<float> v(count + (pg.rank() == 1 ? 1 : 0), 2.0f);
      pg.all_reduce(std::span<float>(v));
    }, {"all_reduce (sum, " + std::to_string(count_for(p) + 1) + " x float32)", "(collective #2 of this group)"});
  }
}

TEST(CallCheck, BroadcastRootsThatDiffer) {
  for (Path p : {Path::kFlat, Path::kShmRing, Path::kTcp}) {  // (a broadcast never takes the slice path)
    SCOPED_TRACE(name(p));
    expect_caught(p, 3, [](ddp::ProcessGroup& pg, size_t count) {
      std::vector<float> v(count, static_cast<float>(pg.rank()));
      pg.broadcast(std::span<float>(v), {.root = pg.rank() == 0 ? 0 : 1});
    }, {"broadcast (root 0,", "broadcast (root 1,"}, p == Path::kFlat ? Ends::kInTheCall : Ends::kByTheNextCall);
    // Two ranks that each take themselves for the root: both send, neither receives.
    expect_caught(p, 2, [](ddp::ProcessGroup& pg, size_t count) {
      std::vector<float> v(count, static_cast<float>(pg.rank()));
      pg.broadcast(std::span<float>(v), {.root = pg.rank()});
    }, {"broadcast (root 0,", "broadcast (root 1,"});
  }
}

TEST(CallCheck, AllGatherAndReduceScatterCounts) {
  for (Path p : {Path::kFlat, Path::kShmRing, Path::kTcp}) {
    SCOPED_TRACE(name(p));
    expect_caught(p, 2, [](ddp::ProcessGroup& pg, size_t count) {
      const size_t mine = count / 2 + (pg.rank() == 1 ? 8 : 0);
      std::vector<float> in(mine, 1.0f), out(mine * 2);
      pg.all_gather(std::span<const float>(in), std::span<float>(out));
    }, {"all_gather (", " per rank)"});
    expect_caught(p, 2, [](ddp::ProcessGroup& pg, size_t count) {
      const size_t mine = count / 2 + (pg.rank() == 1 ? 8 : 0);
      std::vector<float> in(mine * 2, 1.0f), out(mine);
      pg.reduce_scatter(std::span<const float>(in), std::span<float>(out));
    }, {"reduce_scatter (sum, "});
  }
}

// Ranks 0 and 1 share memory, rank 2 is on another (simulated) host: links of both kinds.
TEST(CallCheck, AGroupOfSharedMemoryAndTcpLinks) {
  GroupConfig c = config(Path::kShmRing, 3);
  c.host_ids = {"hostA", "hostA", "hostB"};
  expect_caught(c, 100000, [](ddp::ProcessGroup& pg, size_t count) {
    std::vector<float> v(count + (pg.rank() == 2 ? 64 : 0), 1.0f);
    pg.all_reduce(std::span<float>(v));
  }, {"all_reduce (sum, 100064 x float32)"});
}

TEST(CallCheck, AnotherCollectiveOpOrDtype) {
  for (Path p : {Path::kFlat, Path::kTcp}) {
    SCOPED_TRACE(name(p));
    expect_caught(p, 2, [](ddp::ProcessGroup& pg, size_t count) {
      std::vector<float> v(count, 1.0f);
      if (pg.rank() == 0) pg.all_reduce(std::span<float>(v));
      else pg.barrier();
    }, {"called barrier", "called all_reduce (sum"});  // (whichever rank tells first: both directions say both)
    expect_caught(p, 2, [](ddp::ProcessGroup& pg, size_t count) {
      std::vector<float> v(count, 1.0f);
      pg.all_reduce(std::span<float>(v), {.op = pg.rank() == 0 ? ddp::ReduceOp::kSum : ddp::ReduceOp::kMax});
    }, {"all_reduce (max,"});
    expect_caught(p, 2, [](ddp::ProcessGroup& pg, size_t count) {
      std::vector<int32_t> i(count, 1);
      std::vector<float> f(count, 1.0f);
      if (pg.rank() == 0) pg.all_reduce(std::span<int32_t>(i));
      else pg.all_reduce(std::span<float>(f));  // the same bytes, another dtype
    }, {"x int32)", "x float32)"});
  }
}

// A call with nothing to send meets its peers' calls: a count of 0 against a peer's count
// fails in that call, on every path, naming both. Before, the empty call returned at once
// (no error on that rank), and the mismatch surfaced at the next call, as one rank a call
// ahead ("a rank skipped a collective or made one more"), or, after a last call, only as
// "destroyed its process group".
TEST(CallCheck, ACallWithNothingToSendMeetsItsPeers) {
  for (Path p : kPaths) {
    SCOPED_TRACE(name(p));
    expect_caught(p, 2, [](ddp::ProcessGroup& pg, size_t count) {
      std::vector<float> v(pg.rank() == 0 ? 0 : count, 1.0f);
      pg.all_reduce(std::span<float>(v));
    }, {"all_reduce (sum, 0 x float32)", "all_reduce (sum, " + std::to_string(count_for(p)) + " x float32)",
        "(collective #2 of this group)"});
  }
  for (Path p : {Path::kFlat, Path::kTcp}) {
    SCOPED_TRACE(name(p));
    expect_caught(p, 3, [](ddp::ProcessGroup& pg, size_t count) {  // the other collectives
      std::vector<float> none, in(count * 3, 1.0f), out(count * 3);
      if (pg.rank() == 1) pg.all_gather(std::span<const float>(none), std::span<float>(none));
      else pg.all_gather(std::span<const float>(in.data(), count), std::span<float>(out));
    }, {"all_gather (0 x float32 per rank)"});
    expect_caught(p, 3, [](ddp::ProcessGroup& pg, size_t count) {
      std::vector<float> none, in(count * 3, 1.0f), out(count);
      if (pg.rank() == 1) pg.reduce_scatter(std::span<const float>(none), std::span<float>(none));
      else pg.reduce_scatter(std::span<const float>(in), std::span<float>(out));
    }, {"reduce_scatter (sum, 0 x float32 per rank)"});
    expect_caught(p, 3, [](ddp::ProcessGroup& pg, size_t count) {
      std::vector<float> none, v(count, 1.0f);
      pg.broadcast(pg.rank() == 1 ? std::span<float>(none) : std::span<float>(v));
    }, {"broadcast (root 0, 0 x float32)"}, Ends::kByTheNextCall);
  }
  // On one host the empty call meets a peer's call that took the ring, not the flat exchange.
  expect_caught(Path::kShmRing, 2, [](ddp::ProcessGroup& pg, size_t count) {
    std::vector<float> none, big(count, 1.0f);
    pg.all_reduce(pg.rank() == 0 ? std::span<float>(none) : std::span<float>(big));
  }, {"all_reduce (sum, 0 x float32)", "(collective #2 of this group)"});
}

// Counts that take different algorithms on one host (flat against ring): both ranks used to
// wait for each other until the timeout.
TEST(CallCheck, CallsThatTookDifferentAlgorithms) {
  expect_caught(Path::kShmRing, 2, [](ddp::ProcessGroup& pg, size_t) {
    std::vector<float> v(pg.rank() == 0 ? 1000 : 100000, 1.0f);
    pg.all_reduce(std::span<float>(v));
  }, {"all_reduce (sum, 1000 x float32)", "all_reduce (sum, 100000 x float32)"});
}

// Many calls of every kind that agree: no false alarm, results right (ranks as threads race
// ahead of each other into their next calls).
TEST(CallCheck, AgreeingCallsPass) {
  for (Path p : kPaths) {
    SCOPED_TRACE(name(p));
    GroupConfig c = config(p, 3);
    auto errors = run_ranks(c, [&](ddp::ProcessGroup& pg) {
      for (int i = 0; i < 50; ++i) {
        const size_t count = i % 2 ? count_for(p) : 7;
        std::vector<float> v(count, static_cast<float>(pg.rank() + 1));
        pg.all_reduce(std::span<float>(v));
        if (v[0] != 6.0f) throw std::runtime_error("all_reduce " + std::to_string(i) + " gave " + std::to_string(v[0]));
        pg.broadcast(std::span<float>(v), {.root = i % 3});
        if (i % 5 == 0) pg.barrier();
        std::vector<float> all(count * 3);
        pg.all_gather(std::span<const float>(v), std::span<float>(all));
        std::vector<float> part(count);
        pg.reduce_scatter(std::span<const float>(all), std::span<float>(part));
        if (part[0] != 18.0f) throw std::runtime_error("reduce_scatter " + std::to_string(i) + " gave " + std::to_string(part[0]));
        std::vector<float> none;
        pg.all_reduce(std::span<float>(none));  // counted, sends nothing
      }
    });
    expect_no_errors(errors);
  }
}

// small_message_bytes is rank 0's on every rank: a rank given another value used to read
// past the flat slots (SIGSEGV) or wait for a peer in another algorithm.
TEST(CallCheck, SmallMessageBytesIsRankZeros) {
  GroupConfig c = config(Path::kShmRing, 2);
  auto errors = run_ranks_with(
      2,
      [&](int r, std::shared_ptr<ddp::Store> store) {
        auto o = options_for(c, r, std::move(store));
        o.small_message_bytes = r == 0 ? 64 << 10 : 1 << 20;
        return o;
      },
      [&](ddp::ProcessGroup& pg) {
        for (size_t count : {1000, 30000, 100000}) {
          std::vector<float> v(count, static_cast<float>(pg.rank() + 1));
          pg.all_reduce(std::span<float>(v));
          for (float x : v)
            if (x != 3.0f) throw std::runtime_error(std::to_string(count) + " elements: got " + std::to_string(x));
        }
      });
  expect_no_errors(errors);
}

TEST(CallCheck, SizesBeyondATebibyteAreRefused) {
  for (int which = 0; which < 4; ++which) {
    ddp::ProcessGroupOptions o;
    o.rank = 0;
    o.world_size = 2;
    o.store = std::make_shared<ddp::MemoryStore>();
    size_t& v = which == 0 ? o.small_message_bytes
                : which == 1 ? o.chunk_bytes
                : which == 2 ? o.shm_ring_bytes
                             : o.slice_stage_bytes;
    v = std::numeric_limits<size_t>::max();
    o.timeout = 2s;  // were the check lost, no peer would come: fail at once, not at the ctest timeout
    try {
      ddp::init_process_group(o);
      ADD_FAILURE() << "size option " << which << " accepted";
    } catch (const ddp::UsageError& e) {
      EXPECT_TRUE(contains(e.what(), "is more than 1 TiB")) << e.what();
    }
  }
}
