// CPU backend: ring algorithms over per-neighbour links (shared memory on one host, TCP
// between hosts), a flat shared-memory algorithm for small messages on one host and a
// shared-memory slice all-reduce for large messages on one host.
//
// Ring all-reduce = reduce-scatter (n-1 steps) + all-gather (n-1 steps); each step streams a
// segment to the right neighbour while reducing the one arriving from the left, in
// chunk_bytes pieces, so sending and reducing overlap. Every segment is reduced along the
// same chain on all ranks, so results are bitwise identical everywhere.
//
// Slice all-reduce (every rank on one host; chosen when ranks outnumber the CPUs, where
// each of the ring's 2(n-1) neighbour-synchronised steps costs context switches): per stage
// of slice_stage_bytes, every rank copies its input into its staging area, barrier, rank r
// reduces slice r of all n inputs (rank order) into the shared result area, barrier, every
// rank copies the stage's result out. Each element is reduced once, by one rank, so results
// are bitwise identical everywhere.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <sched.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "../backends.hpp"
#include "../reduce.hpp"
#include "../progress_record.hpp"
#include "../slices.hpp"
#include "ddp/error.hpp"
#include "ddp/tcp_store.hpp"
#include "call_check.hpp"
#include "shm.hpp"
#include "tcp.hpp"

namespace ddp::detail {
namespace {

using TimePoint = Clock::time_point;
using std::chrono::milliseconds;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

std::string read_line(const char* path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

std::string read_link(const char* path) {
  char buf[256];
  ssize_t n = readlink(path, buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// Ranks with equal identities can share memory and see each other's pids.
std::string host_identity() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return fmt::format("{}|{}|{}|{}|{}", name, read_line("/proc/sys/kernel/random/boot_id"),
                     read_link("/proc/self/ns/mnt"), read_link("/proc/self/ns/pid"),
                     read_link("/proc/self/ns/ipc"));
}

int open_pidfd(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  return -1;
#endif
}

// Waiting for a peer: pause-spin, then sched_yield (lets an oversubscribed core run the
// peer), then sleep on the doorbell/sockets in slices, checking deadline and peers between.
constexpr auto kSpinFor = std::chrono::microseconds(20);
constexpr auto kYieldFor = std::chrono::microseconds(200);
constexpr long kMaxSleepUs = 5000;

// How long a failing rank tries to leave its notice in the store before it raises its flag
// and closes its links (a store that answers takes milliseconds; then kAbortNoticeBudget).
constexpr milliseconds kFirstNoticeBudget{50};

// Automatic slice threshold (bytes per rank) when ranks outnumber the CPUs.
constexpr size_t kAutoSliceMin = 128 << 10;

struct StepDesc {
  const char* phase;
  int step;
  int steps;
};

class CpuGroup final : public GroupBase {
 public:
  explicit CpuGroup(const ProcessGroupOptions& o)
      : GroupBase(o.rank, o.world_size, Backend::kCpu, o.timeout), opts_(o), store_(o.store),
        name_(o.name), chunk_(std::max<size_t>(o.chunk_bytes, 64)), small_(o.small_message_bytes) {
    chunk_ = (chunk_ + 63) / 64 * 64;
    if (size() == 1) return;
    auto deadline = detail::deadline_after(o.timeout);
    try {
      bootstrap(deadline);
      do_barrier(deadline);
    } catch (const TimeoutError& e) {
      on_failure(e.what());
      throw TimeoutError(fmt::format("ddp init_process_group (cpu) on rank {} of {}: {}", rank(),
                                     size(), e.what()));
    } catch (const UsageError& e) {  // (a world size other than rank 0's: the caller's to fix)
      on_failure(e.what());
      throw UsageError(fmt::format("ddp init_process_group (cpu) on rank {} of {}: {}", rank(), size(),
                                   e.what()));
    } catch (const Error& e) {
      on_failure(e.what());
      throw CollectiveError(fmt::format("ddp init_process_group (cpu) on rank {} of {}: {}",
                                        rank(), size(), e.what()));
    }
  }

  ~CpuGroup() override {
    leave();
    for (auto& p : peers_)
      if (p.pidfd >= 0) close(p.pidfd);
  }

 protected:
  void do_all_reduce(void* data, size_t count, DType dt, ReduceOp op, TimePoint dl) override {
    begin_call(ProgressRecord::kAllReduce, dt, op, -1, count);
    if (size() == 1) return;
    if (count == 0) return calls_only(dl);
    const size_t bytes = count * dtype_size(dt);
    if (op == ReduceOp::kAvg && avg_scales_first(dt)) {
      scale_for_avg(dt, data, data, count, size());
      op = ReduceOp::kSum;
    }
    guarded([&] {
      if (all_local_ && bytes <= small_)
        flat_all_reduce(static_cast<uint8_t*>(data), count, dt, op, dl);
      else if (all_local_ && seg_->slice_bytes() && seg_->slice_min() && bytes >= seg_->slice_min())
        slice_all_reduce(static_cast<uint8_t*>(data), count, dt, op, dl);
      else
        ring_all_reduce(static_cast<uint8_t*>(data), count, dt, op, dl);
    });
  }

  void do_broadcast(void* data, size_t count, DType dt, int root, TimePoint dl) override {
    begin_call(ProgressRecord::kBroadcast, dt, ReduceOp::kSum, root, count);
    size_t bytes = count * dtype_size(dt);
    if (size() == 1) return;
    if (bytes == 0) return calls_only(dl);
    guarded([&] {
      auto* d = static_cast<uint8_t*>(data);
      if (all_local_ && bytes <= small_) {
        uint32_t k = flat_post(rank() == root ? d : nullptr, rank() == root ? bytes : 0, bytes);
        flat_wait_all(k, dl);
        if (rank() != root) std::memcpy(d, flat_data(k, root, bytes), bytes);
        return;
      }
      ring_broadcast(d, bytes, root, dl);
    });
  }

  void do_all_gather(const void* input, void* output, size_t count, DType dt, TimePoint dl) override {
    begin_call(ProgressRecord::kAllGather, dt, ReduceOp::kSum, -1, count);
    size_t bytes = count * dtype_size(dt);
    auto* out = static_cast<uint8_t*>(output);
    auto* in = static_cast<const uint8_t*>(input);
    if (bytes == 0) return size() == 1 ? void() : calls_only(dl);
    if (out + rank() * bytes != in) std::memmove(out + rank() * bytes, in, bytes);
    if (size() == 1) return;
    guarded([&] {
      const int n = size(), r = rank();
      if (all_local_ && bytes <= small_) {
        uint32_t k = flat_post(out + r * bytes, bytes, bytes);
        flat_wait_all(k, dl);
        for (int p = 0; p < n; ++p)
          if (p != r) std::memcpy(out + p * bytes, flat_data(k, p, bytes), bytes);
        return;
      }
      for (int s = 0; s < n - 1; ++s) {
        int sj = mod(r - s), rj = mod(r - s - 1);
        uint8_t* dst = out + rj * bytes;
        exchange(out + sj * bytes, bytes, bytes, 1,
                 [&](size_t o, const uint8_t* p, size_t len) { std::memcpy(dst + o, p, len); }, dl,
                 {"all-gather", s, n - 1});
      }
      end_messages();
    });
  }

  void do_reduce_scatter(const void* input, void* output, size_t count, DType dt, ReduceOp op,
                         TimePoint dl) override {
    begin_call(ProgressRecord::kReduceScatter, dt, op, -1, count);
    const size_t es = dtype_size(dt), bytes = count * es;
    auto* in = static_cast<const uint8_t*>(input);
    auto* out = static_cast<uint8_t*>(output);
    if (size() == 1) {
      if (bytes && in != out) std::memmove(out, in, bytes);
      return;
    }
    if (bytes == 0) return calls_only(dl);
    if (op == ReduceOp::kAvg && avg_scales_first(dt)) {  // the input is the caller's: a copy
      scaled_.resize(bytes * size());
      scale_for_avg(dt, scaled_.data(), in, count * size(), size());
      in = scaled_.data();
      op = ReduceOp::kSum;
    }
    guarded([&] {
      const int n = size(), r = rank();
      if (all_local_ && bytes * n <= small_) {
        uint32_t k = flat_post(in, bytes * n, bytes * n);
        flat_wait_all(k, dl);
        const size_t all = bytes * n;
        reduce_into(dt, op, out, flat_data(k, 0, all) + r * bytes, flat_data(k, 1, all) + r * bytes, count);
        for (int p = 2; p < n; ++p) reduce_inplace(dt, op, out, flat_data(k, p, all) + r * bytes, count);
      } else {
        for (auto& t : tmp_) t.resize(bytes);
        for (int s = 0; s < n - 1; ++s) {
          int sj = mod(r - s - 1), rj = mod(r - s - 2);
          const uint8_t* src = s == 0 ? in + sj * bytes : tmp_[(s - 1) % 2].data();
          uint8_t* dst = s == n - 2 ? out : tmp_[s % 2].data();
          const uint8_t* mine = in + rj * bytes;
          exchange(src, bytes, bytes, es,
                   [&](size_t o, const uint8_t* p, size_t len) {
                     reduce_into(dt, op, dst + o, mine + o, p, len / es);
                   },
                   dl, {"reduce-scatter", s, n - 1});
        }
        end_messages();
      }
      if (op == ReduceOp::kAvg) avg_finish(dt, out, count, n);
    });
    if (scaled_.capacity() > (size_t{64} << 20)) std::vector<uint8_t>().swap(scaled_);  // not held for the group's life
  }

  void do_barrier(TimePoint dl) override {
    begin_call(ProgressRecord::kBarrier, DType::kUInt8, ReduceOp::kSum, -1, 0);
    if (size() == 1) return;
    calls_only(dl);
  }

  // The calls meet, and nothing else crosses: a barrier, and a call with nothing to send,
  // which a peer's call with a count must still meet (before, a count of 0 returned at once,
  // and the mismatch was found only at the next call, as one rank a call ahead).
  void calls_only(TimePoint dl) {
    guarded([&] {
      if (all_local_) {
        flat_wait_all(flat_post(nullptr, 0, 0), dl);
      } else {
        uint8_t one = 1;
        ring_all_reduce(&one, 1, DType::kUInt8, ReduceOp::kMax, dl);
      }
    });
  }

  // The notice first, briefly, so that every peer that learns from the flag or the links
  // finds it (their errors quote it); then the flag and the links; then, if the store did not
  // take the notice in time, again for longer: the bootstrap's waits hear of a failure only
  // through it. (A failure inside a collective did the first two already, in guarded.) With
  // the whole budget first, each rank of a TCP ring learnt of a loss 2 s after its neighbour
  // when the store had died with rank 0 (no launcher): 12 s for 8 ranks.
  void on_failure(const std::string& reason) noexcept override {
    const bool left = leave_notice(reason, kFirstNoticeBudget);
    fail_locally();
    if (!left) leave_notice(reason, kAbortNoticeBudget);
  }

  bool leave_notice(const std::string& reason, milliseconds budget) noexcept {
    if (!store_) return false;
    try {
      // Best effort, and short: a store that is gone (rank 0 hosted it and died) is not
      // waited for over its connect_timeout (a minute) before this rank reports.
      StoreCallDeadline bounded(budget);
      store_->set(key(fmt::format("abort/{}", rank())), reason);
      store_->set(key("abort"), std::to_string(rank()));  // one key for waiters to check
      return true;
    } catch (...) {
      return false;
    }
  }

 private:
  struct LocalPeer {
    int rank;
    int local;
    pid_t pid = 0;
    int pidfd = -1;
  };
  struct Waiter {
    int idle = 0;  // attempts without progress
    TimePoint idle_since{};
    TimePoint next_check{};
    bool saw_gone = false;  // a peer exited or left: the next check that finds it so throws
  };

  int mod(int x) const { return ((x % size()) + size()) % size(); }
  std::string key(const std::string& k) const { return name_ + "/" + k; }

  std::string store_get(const std::string& k, TimePoint deadline) {
    wait_keys({key(k)}, deadline);
    return store_->get(key(k));
  }

  // Bootstrap waits end at once when another rank reported a failure (on_failure sets
  // "<name>/abort"), quoting it.
  std::optional<std::string> peer_failed() {
    if (!store_->check({key("abort")})) return std::nullopt;
    return "another rank failed" + peer_reports();
  }
  void wait_keys(const std::vector<std::string>& keys, TimePoint deadline) {
    wait_for_keys(*store_, keys, deadline,
                  fmt::format("waiting for store key(s) {}", fmt::join(keys, ", ")),
                  [&] { return peer_failed(); });
  }
  template <class Step>
  void abortable(TimePoint deadline, const std::string& what, Step&& step) {
    wait_in_slices(deadline, what, step, [&] { return peer_failed(); });
  }

  // ---- bootstrap ----------------------------------------------------------------------
  void bootstrap(TimePoint deadline) {
    const int n = size(), r = rank();
    if (!store_) throw UsageError("a store is required for world_size > 1");
    if (r == 0) {
      std::random_device rd;
      tag_ = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(getpid());
      // With the tag, rank 0's small_message_bytes (every rank must choose the flat
      // algorithm for the same calls, and its slots are sized by the segment's creator) and
      // its world size (a rank given another one is told at once, not after the timeout).
      store_->set(key("tag"), fmt::format("{} {} {}", tag_, small_, n));
    }
    bool all_same = true;
    std::vector<bool> shm = find_local_ranks(deadline, all_same);
    // Shared memory first: whether this host got a segment decides which links are TCP.
    if (local_.size() > 1 && !setup_shm(deadline)) {
      for (int i = 0; i < n; ++i) shm[i] = i == r;
      local_ = {r};
      my_local_ = 0;
      all_local_ = false;
    }
    link_ring(deadline, shm, all_same);
  }

  // Publishes this rank's host and reads the others' (and rank 0's tag): which ranks share
  // this host (all_same: every one), and with which this rank may share memory (true at its
  // own index). Fills local_, my_local_ and all_local_.
  std::vector<bool> find_local_ranks(TimePoint deadline, bool& all_same) {
    const int n = size(), r = rank();
    // The host identity, and whether this rank may share memory: a rank told to use TCP
    // says so, and both ends of each of its links then choose TCP, even if the other rank
    // was left on kAuto.
    constexpr std::string_view kTcpOnly = "\x1ftcp-only";
    const std::string me = opts_.host_id.empty() ? host_identity() : opts_.host_id;
    const bool tcp_only = opts_.transport == Transport::kTcp;
    store_->set(key(fmt::format("host/{}", r)), tcp_only ? me + std::string(kTcpOnly) : me);
    // Rank 0 published the tag before its host: a missing rank 0 is named as any other.
    std::vector<int> others;
    for (int i = 1; i < n; ++i)
      if (i != r) others.push_back(i);
    if (r != 0) {
      wait_for_ranks({0}, deadline);
      read_tag(store_->get(key("tag")));
    }
    wait_for_ranks(others, deadline);
    std::vector<bool> same(n), shm(n);
    for (int i = 0; i < n; ++i) {
      bool peer_tcp_only = tcp_only;
      if (i != r) {
        std::string v = store_->get(key(fmt::format("host/{}", i)));
        peer_tcp_only = v.ends_with(kTcpOnly);
        if (peer_tcp_only) v.resize(v.size() - kTcpOnly.size());
        same[i] = v == me;
      } else {
        same[i] = true;
      }
      shm[i] = same[i] && !tcp_only && !peer_tcp_only;
      all_same = all_same && same[i];
      if (shm[i]) {
        if (i == r) my_local_ = static_cast<int>(local_.size());
        local_.push_back(i);
      }
    }
    all_local_ = local_.size() > 1 && static_cast<int>(local_.size()) == n;
    return shm;
  }

  // Rank 0's "<tag> <small_message_bytes> <world size>".
  void read_tag(const std::string& v) {
    const char* end = v.data() + v.size();
    int n0 = 0;
    auto got = std::from_chars(v.data(), end, tag_);
    bool ok = got.ec == std::errc() && got.ptr < end && *got.ptr == ' ';
    if (ok) got = std::from_chars(got.ptr + 1, end, small_);
    ok = ok && got.ec == std::errc() && got.ptr < end && *got.ptr == ' ';
    if (ok) got = std::from_chars(got.ptr + 1, end, n0);
    if (!ok || got.ec != std::errc() || got.ptr != end)
      throw CollectiveError(fmt::format("rank 0 published '{}' as the group's tag: is rank 0 running another "
                                        "version of libddp? every rank needs the same one",
                                        v.substr(0, 64)));
    if (n0 != size())
      throw UsageError(fmt::format("rank 0 has world size {}, this rank ({}) {}: every rank needs the same "
                                   "WORLD_SIZE (world_size)",
                                   n0, rank(), size()));
  }

  // A group made again under its name on this store is "name#k" (init_process_group): every
  // rank must make it as often, and a second process started with the same RANK lands here.
  std::string made_again_hint() const {
    const size_t hash = opts_.name.rfind('#');
    if (hash == std::string::npos) return "";
    return fmt::format("; this rank's group is '{}' made again (#{} of that name by rank {} on this store): every "
                       "rank must make it as often, so two processes started with RANK={} also land here",
                       opts_.name.substr(0, hash), opts_.name.substr(hash + 1), rank(), rank());
  }

  // These ranks have published their hosts: at the deadline, which have not (a rank that
  // never started, started late, or was given another MASTER_ADDR, MASTER_PORT or name).
  void wait_for_ranks(const std::vector<int>& ranks, TimePoint deadline) {
    if (ranks.empty()) return;
    std::vector<std::string> keys;
    for (int i : ranks) keys.push_back(key(fmt::format("host/{}", i)));
    try {
      wait_for_keys(*store_, keys, deadline, "waiting for the other ranks to join", [&] { return peer_failed(); });
    } catch (const TimeoutError&) {
      std::vector<int> missing;
      for (size_t k = 0; k < keys.size(); ++k)
        if (!store_->check({keys[k]})) missing.push_back(ranks[k]);
      if (missing.empty()) throw;
      throw TimeoutError(fmt::format("rank{} {} of {} did not join within the timeout ({} ms): no '{}' key in the "
                                     "store (not started yet, or started with another MASTER_ADDR, MASTER_PORT "
                                     "or group name){}",
                                     missing.size() == 1 ? "" : "s", fmt::join(missing, ", "), size(),
                                     opts_.timeout.count(), key("host/N"), made_again_hint()));
    }
  }

  // The ring's two links (one when n == 2): shared memory with the neighbours in shm, TCP
  // with the others.
  void link_ring(TimePoint deadline, const std::vector<bool>& shm, bool all_same) {
    const int n = size(), r = rank();
    const int right = mod(r + 1), left = mod(r - 1);
    // TCP: accept from the left, connect to the right (n == 2: rank 0 connects, 1 accepts).
    bool accept_left = !shm[left] && (n > 2 || r == 1);
    bool connect_right = !shm[right] && (n > 2 || r == 0);
    Fd listener;
    if (accept_left) {
      uint16_t port = 0;
      listener = tcp_listen(port);
      std::string host = advertised_host(all_same);
      store_->set(key(fmt::format("addr/{}", r)), fmt::format("{} {}", host, port));
    }

    std::shared_ptr<Link> to_right, from_left;
    if (connect_right) {
      std::string addr = store_get(fmt::format("addr/{}", right), deadline);
      auto sp = addr.rfind(' ');
      std::string host = addr.substr(0, sp);
      auto port = static_cast<uint16_t>(std::stoi(addr.substr(sp + 1)));
      Fd fd;
      abortable(deadline, fmt::format("connecting to rank {}", right), [&](TimePoint until) {
        fd = tcp_connect_peer(host, port, tag_, r, right, until);
      });
      to_right = std::make_shared<TcpLink>(right, std::move(fd), fmt::format("{}:{}", host, port),
                                           4 * chunk_);
    }
    if (accept_left) {
      Fd fd;
      abortable(deadline, fmt::format("waiting for rank {} to connect", left), [&](TimePoint until) {
        fd = tcp_accept_peer(listener.get(), tag_, left, until);
      });
      std::string addr = peer_address(fd.get());
      from_left = std::make_shared<TcpLink>(left, std::move(fd), std::move(addr), 4 * chunk_);
    }
    if (n == 2) {
      if (shm[right]) {
        to_right = std::make_shared<ShmLink>(right, *seg_, my_local_, local_index(right),
                                             &seg_->rank(local_index(right)).bell, my_bell_);
      }
      if (!to_right) to_right = from_left;
      from_left = to_right;
    } else {
      if (shm[right])
        to_right = std::make_shared<ShmLink>(right, *seg_, my_local_, -1,
                                             &seg_->rank(local_index(right)).bell, my_bell_);
      if (shm[left])
        from_left = std::make_shared<ShmLink>(left, *seg_, -1, local_index(left),
                                              &seg_->rank(local_index(left)).bell, my_bell_);
    }
    right_ = to_right;
    left_ = from_left;
  }

  int local_index(int global) const {
    auto it = std::find(local_.begin(), local_.end(), global);
    return it == local_.end() ? -1 : static_cast<int>(it - local_.begin());
  }

  // CPUs this process may run on (the affinity mask; containers often restrict it).
  static int usable_cpus() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c > 0 ? static_cast<int>(c) : 1;
  }

  // A host the user named (options.host, $DDP_HOST) is the address the other ranks connect
  // to: an IPv4 address, or a name that resolves to one, checked here. Before, a typo (or
  // an IPv6 address) left every peer retrying it until the group's timeout, 300 s.
  // (A name's lookup that fails for now, EAI_AGAIN, is left to the peers' retries.)
  static std::string checked_host(const char* source, const std::string& host) {
    in_addr v4{};
    in6_addr v6{};
    if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return host;
    int gai = 0;
    if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
      gai = EAI_ADDRFAMILY;
    } else {
      addrinfo hints{};
      hints.ai_family = AF_INET;
      hints.ai_socktype = SOCK_STREAM;
      addrinfo* res = nullptr;
      gai = getaddrinfo(host.c_str(), nullptr, &hints, &res);
      if (res) freeaddrinfo(res);
    }
    if (gai == EAI_NONAME || gai == EAI_ADDRFAMILY || gai == EAI_NODATA || gai == EAI_FAIL)
      throw UsageError(fmt::format("{} '{}' is not an IPv4 address, nor a name of one ({}): it is the address the "
                                   "other ranks connect to this one at (the TCP transport is IPv4)",
                                   source, host, gai_strerror(gai)));
    return host;
  }

  std::string advertised_host(bool all_same) const {
    if (!opts_.host.empty()) return checked_host("ProcessGroupOptions::host", opts_.host);
    if (const char* h = std::getenv("DDP_HOST"); h && *h) return checked_host("DDP_HOST", h);
    if (all_same) return "127.0.0.1";
    if (const char* m = std::getenv("MASTER_ADDR"); m && *m) {
      std::string a = local_address_towards(m);
      if (!a.empty() && a != "0.0.0.0") return a;
    }
    std::string a = hostname_address();
    return a.empty() ? "127.0.0.1" : a;
  }

  // Maps this host's segment. Returns false when the host's first rank could not create it
  // (e.g. /dev/shm too small): it publishes that instead of a name, and every rank of this
  // host then uses TCP to its local peers, so both ends of every link agree.
  bool setup_shm(TimePoint deadline) {
    const int nlocal = static_cast<int>(local_.size());
    const int leader = local_[0];
    const std::string shm_key = fmt::format("shm/{}", leader);
    constexpr std::string_view kNoShm = "none: ";  // segment names start with '/'
    if (rank() == leader) {
      // The slice threshold is decided here once (it may depend on this rank's CPU count)
      // and published in the segment, so every rank picks the same algorithm.
      size_t slice_min = all_local_ ? opts_.slice_min_bytes : 0;
      if (slice_min == ProcessGroupOptions::kAutoSlice)
        slice_min = size() > usable_cpus() ? kAutoSliceMin : 0;
      size_t stage = slice_min ? std::max<size_t>(opts_.slice_stage_bytes, 64) : 0;
      try {
        seg_ = ShmSegment::create(nlocal, opts_.shm_ring_bytes, std::max<size_t>(small_, 64) + kFlatHeaderBytes,
                                  stage, slice_min);
      } catch (const SystemError& e) {
        store_->set(key(shm_key), fmt::format("{}{}", kNoShm, e.what()));
        bool space = e.code() == ENOSPC || e.code() == ENOMEM || e.code() == EFBIG;
        fmt::print(stderr,
                   "ddp: warning: shared memory unavailable ({}); ranks on this host use loopback "
                   "TCP (slower).{}\n",
                   e.what(), space ? " Enlarge /dev/shm (docker run --shm-size=...)." : "");
        return false;
      }
      store_->set(key(shm_key), seg_->name());
    } else {
      std::string name = store_get(shm_key, deadline);
      if (name.starts_with(kNoShm)) return false;
      seg_ = ShmSegment::open(name, nlocal);
    }
    seg_->rank(my_local_).pid.store(static_cast<int32_t>(getpid()));
    my_bell_ = &seg_->rank(my_local_).bell;
    for (int i = 0; i < nlocal; ++i)
      if (i != my_local_) peers_.push_back(LocalPeer{local_[i], i});
    store_->set(key(fmt::format("shm_mapped/{}", rank())), "1");
    if (rank() == leader) {
      // Remove the name as soon as everyone has it mapped: nothing leaks if ranks die.
      std::vector<std::string> keys;
      for (int g : local_) keys.push_back(key(fmt::format("shm_mapped/{}", g)));
      try {
        wait_keys(keys, deadline);
      } catch (...) {
        seg_->unlink();
        throw;
      }
      seg_->unlink();
    }
    return true;
  }

  // ---- failure detection ----------------------------------------------------------------
  // What failed peers wrote in the store, quoted.
  std::string peer_reports() noexcept {
    std::string out;
    if (!store_) return out;
    try {
      StoreCallDeadline bounded(kAbortNoticeBudget);  // a store that is gone: not its connect_timeout
      int found = 0;
      for (int i = 0; i < size() && found < 2; ++i) {
        if (i == rank()) continue;
        std::string k = key(fmt::format("abort/{}", i));
        if (!store_->check({k})) continue;
        std::string v = store_->get(k);
        if (v.size() > 400) v = v.substr(0, 400) + "...";
        if (out.find(v) != std::string::npos) continue;  // already quoted by another report
        out += fmt::format("; rank {} reported: {}", i, v);
        ++found;
      }
    } catch (...) {
    }
    return out;
  }

  // Destroyed between two collectives: a peer still waiting for a call (it made more) is told
  // at once, not at its timeout: on this host through this rank's record, over TCP by a
  // header in place of the next call's (left_ closes with the group; its sender learns from
  // the ring's other peers, or the link).
  // (Not in a forked child that ends: the group, its record and its links are the parent's.)
  void leave() noexcept {
    if (size() == 1 || failed_ || !made_here()) return;
    if (seg_ && my_local_ >= 0) {
      seg_->rank(my_local_).left_after.store(calls_, std::memory_order_relaxed);
      mark_and_wake(kRankLeft);
    }
    if (right_ && right_->fd() >= 0) {
      CallHeader h;
      h.words = CallDesc::left(calls_).words();
      right_->leave(reinterpret_cast<const uint8_t*>(&h), sizeof h);
    }
  }

  // This rank's record says how it ended (release: what it wrote before is visible with it),
  // and every rank of the host wakes to read it.
  void mark_and_wake(uint32_t state) noexcept {
    seg_->rank(my_local_).aborted.store(state, std::memory_order_release);
    for (int i = 0; i < seg_->nlocal(); ++i) ring_bell(seg_->rank(i).bell);
  }

  void fail_locally() noexcept {
    failed_ = true;
    if (seg_ && my_local_ >= 0) mark_and_wake(kRankFailed);
    if (right_) right_->shutdown();
    if (left_) left_->shutdown();
  }

  template <class F>
  void guarded(F&& f) {
    try {
      f();
    } catch (const Error& e) {
      // As on_failure, briefly: what the peers reported so far, and this rank's notice quoting
      // it, before the flag and the links. Each notice then carries the chain back to the
      // first failure, and a peer that learns from this rank finds it.
      std::string quoted;
      {
        StoreCallDeadline bounded(kFirstNoticeBudget);
        quoted = peer_reports();
        leave_notice(e.what() + quoted, kFirstNoticeBudget);
      }
      fail_locally();
      rethrow_with(quoted);
    }
  }

  [[noreturn]] static void rethrow_with(const std::string& quoted) {
    try {
      throw;
    } catch (const TimeoutError& e) {
      throw TimeoutError(e.what() + quoted);
    } catch (const CollectiveError& e) {
      throw CollectiveError(e.what() + quoted);
    }
  }

  // Dead peers first (the root cause), then peers that gave up because of something else.
  // A peer that exited or destroyed its group ends the wait only if the attempt after this
  // rank saw it made no progress: it may have left what this rank waits for just before.
  void check_peers(Waiter& w) {
    std::string gone = gone_peer();
    if (!gone.empty()) {
      if (w.saw_gone) throw CollectiveError(gone);
      w.saw_gone = true;
      return;
    }
    for (auto& p : peers_)
      if (seg_->rank(p.local).aborted.load(std::memory_order_acquire) == kRankFailed)
        throw CollectiveError(fmt::format("peer rank {} (this host) failed", p.rank));
  }

  // The first local peer that exited, or destroyed its group (""; none), unless it did so
  // after this rank's call: it finished the call and owes nothing more (its right neighbour
  // may still be sending its last part to the next rank, a stall that is not the peer's).
  std::string gone_peer() {
    const pid_t self = getpid();
    auto left_after_this_call = [&](const RankCtl& c) {
      return c.aborted.load(std::memory_order_acquire) == kRankLeft &&
             c.left_after.load(std::memory_order_relaxed) >= call_.seq;
    };
    for (auto& p : peers_) {
      RankCtl& c = seg_->rank(p.local);
      if (p.pid == 0) {
        p.pid = c.pid.load(std::memory_order_acquire);
        if (p.pid != 0 && p.pid != self) p.pidfd = open_pidfd(p.pid);
      }
      if (p.pid == 0 || p.pid == self) continue;
      bool dead = false;
      if (p.pidfd >= 0) {
        pollfd pfd{p.pidfd, POLLIN, 0};
        dead = poll(&pfd, 1, 0) > 0;
      } else {
        dead = kill(p.pid, 0) != 0 && errno == ESRCH;
      }
      // (One that left its group first and then exited is told below: it made fewer calls.)
      if (dead && c.aborted.load(std::memory_order_acquire) != kRankLeft)
        return fmt::format("peer rank {} (pid {}, this host) exited", p.rank, p.pid);
    }
    for (auto& p : peers_) {
      const RankCtl& c = seg_->rank(p.local);
      if (c.aborted.load(std::memory_order_acquire) == kRankLeft && !left_after_this_call(c))
        return call_mismatch(p.rank, CallDesc::left(c.left_after.load(std::memory_order_relaxed)), call_);
    }
    return "";
  }

  uint32_t bell_ticket() const {
    return my_bell_ ? my_bell_->seq.load(std::memory_order_seq_cst) : 0;
  }

  // Called when an attempt made no progress: spin, yield, then sleep on the doorbell or
  // poll the sockets; checks the deadline and the peers between sleeps.
  template <class Describe>
  void wait(Waiter& w, uint32_t ticket, TimePoint deadline, Link* send, Link* recv,
            Describe&& describe) {
    if (w.idle++ == 0) w.idle_since = Clock::now();
    if ((w.idle & 15) != 0) {  // read the clock every 16 attempts
      cpu_relax();
      return;
    }
    auto now = Clock::now();
    if (now - w.idle_since < kSpinFor) {
      cpu_relax();
      return;
    }
    if (now - w.idle_since < kYieldFor && now < deadline) {
      std::this_thread::yield();
      return;
    }
    if (now >= deadline)
      throw TimeoutError(fmt::format("timed out after {} {}", format_duration(op_timeout()), describe()));
    if (now >= w.next_check) {
      if (seg_) {
        check_peers(w);
        check_waiting_calls(recv);  // e.g. a peer whose call took another algorithm waits for this rank elsewhere
      }
      // Waiting means what is buffered cannot make progress: at EOF it never will.
      if (recv && recv->at_eof()) recv->fail_at_eof();
      w.next_check = now + milliseconds(5);
    }
    long budget_us = std::min<long>(
        kMaxSleepUs, std::chrono::duration_cast<std::chrono::microseconds>(deadline - now).count() + 1);
    pollfd fds[2];
    int nf = 0;
    bool any_shm = false;
    auto add = [&](Link* l, short ev) {
      if (!l) return;
      if (l->fd() < 0) {
        any_shm = true;
        return;
      }
      for (int i = 0; i < nf; ++i)
        if (fds[i].fd == l->fd()) {
          fds[i].events |= ev;
          return;
        }
      fds[nf++] = pollfd{l->fd(), ev, 0};
    };
    add(send, POLLOUT);
    add(recv, POLLIN);
    if (nf > 0)
      poll(fds, nf, any_shm ? 1 : static_cast<int>(std::max<long>(1, budget_us / 1000)));
    else if (my_bell_)
      wait_bell(*my_bell_, ticket, budget_us);
    else
      std::this_thread::sleep_for(std::chrono::microseconds(std::min<long>(budget_us, 1000)));
  }

  // ---- the call check (call_check.hpp) --------------------------------------------------
  void begin_call(ProgressRecord::Op kind, DType dt, ReduceOp op, int root, size_t count) {
    call_ = CallDesc{++calls_, static_cast<uint8_t>(kind), static_cast<uint8_t>(dt), static_cast<uint8_t>(op), root,
                     count};
    header_out_ = CallHeader{};
    header_out_.words = call_.words();
    header_sent_ = header_recvd_ = 0;
    out_prefix_ = in_prefix_ = sizeof(CallHeader);
    published_ = false;
  }

  // Every peer has posted flat exchange k: the header each wrote with it is the call it made
  // (its slot is not written again before this rank posts once more).
  void check_flat_headers(uint32_t k) {
    for (auto& p : peers_) {
      CallHeader h;
      std::memcpy(&h, seg_->flat_slot(k, p.local), sizeof h);
      check_header(h, p.rank, "shared memory");
    }
  }

  // While waiting: publishes this rank's call (once per call), and compares the calls that
  // waiting peers published with it. Only a peer in the same call is compared: another may
  // be slower, or already in its next call.
  //
  // In the flat exchange (flat_waiting_k_ != 0): a peer already in a later call that never
  // posted this call's exchange skipped a call or made a different one (two ranks whose
  // calls took different algorithms, with numbers out of step, otherwise wait on each other).
  //
  // On the ring (recv: the left link): a left neighbour already in a later call whose header
  // for this call never came skipped it (it sends its header before it can leave a call).
  void check_waiting_calls(const Link* recv) {
    if (!published_) publish_call(seg_->rank(my_local_), call_);
    published_ = true;
    for (auto& p : peers_) {
      CallDesc theirs;
      if (!read_call(seg_->rank(p.local), theirs)) continue;
      if (theirs.seq == call_.seq ? !(theirs == call_) : theirs.seq > call_.seq && left_behind(p, recv))
        throw CollectiveError(call_mismatch(p.rank, theirs, call_));
    }
  }

  // Whether peer p, seen in a later call, left this one without what this rank waits for.
  bool left_behind(const LocalPeer& p, const Link* recv) {
    if (flat_waiting_k_) return !posted(p, flat_waiting_k_);
    return recv && recv == left_.get() && p.rank == left_->peer() && header_recvd_ == 0 && left_->peek().empty();
  }

  bool header_done() const { return header_sent_ == out_prefix_ && header_recvd_ == in_prefix_; }

  // Sends what it can of this call's header, with the start of the step's data (src, slen;
  // `sent` of it gone) in the same send: one packet on TCP, not two. Takes what has come of
  // the left neighbour's header, which it checks once whole. True on progress.
  bool header_step(const uint8_t* src, size_t slen, size_t& sent) {
    bool progress = false;
    const size_t d = std::min(slen - sent, chunk_);
    if (header_sent_ == 0) {  // the data goes on at a cache line (shared memory), a page (large over TCP)
      const bool tcp = right_->fd() >= 0;
      const size_t to = !tcp ? 64 : d >= (64 << 10) ? CallHeader::kPaddedBytes : sizeof(CallHeader);
      header_out_.skip = static_cast<uint32_t>(to - sizeof(CallHeader));
      out_prefix_ = sizeof(CallHeader) + header_out_.skip;
      std::memcpy(header_prefix_.data(), &header_out_, sizeof header_out_);
    }
    if (header_sent_ < out_prefix_) {
      const size_t h = out_prefix_ - header_sent_;
      size_t k = right_->try_send2(header_prefix_.data() + header_sent_, h, src + sent, d);
      header_sent_ += std::min(k, h);
      if (k > h) sent += k - h;
      progress = k > 0;
    }
    if (header_recvd_ < in_prefix_) {
      auto v = left_->peek();
      size_t take = std::min(v.size(), in_prefix_ - header_recvd_);
      if (take > 0) {
        if (header_recvd_ < sizeof(CallHeader)) {
          take = std::min(take, sizeof(CallHeader) - header_recvd_);
          std::memcpy(reinterpret_cast<uint8_t*>(&header_in_) + header_recvd_, v.data(), take);
        }
        left_->consume(take);
        header_recvd_ += take;
        progress = true;
        if (header_recvd_ == sizeof(CallHeader)) {
          check_header(header_in_, left_->peer(), left_->kind());
          in_prefix_ += header_in_.skip;
        }
      }
    }
    return progress;
  }

  std::string awaiting_header() const {
    return fmt::format("waiting for peer rank {} to begin {} (collective #{} of this group) over {}", left_->peer(),
                       call_.describe(), call_.seq, left_->kind());
  }

  void check_header(const CallHeader& h, int peer, const char* over) const {
    if (h.magic != CallHeader::kMagic || h.skip > CallHeader::kPaddedBytes - sizeof(CallHeader))
      throw CollectiveError(fmt::format(
          "the bytes from peer rank {} over {} do not begin a collective call: an earlier call of this group "
          "differed between ranks",
          peer, over));
    CallDesc theirs = CallDesc::from_words(h.words);
    if (!(theirs == call_)) throw CollectiveError(call_mismatch(peer, theirs, call_));
  }

  // ---- ring machinery ------------------------------------------------------------------
  template <class OnRecv>
  void exchange(const uint8_t* src, size_t slen, size_t rlen, size_t es, OnRecv&& on_recv,
                TimePoint dl, StepDesc d) {
    size_t sent = 0, recvd = 0;
    Waiter w;
    while (!header_done() || sent < slen || recvd < rlen) {
      uint32_t ticket = bell_ticket();
      // The call's header goes first each way (the first exchange of a call carries it).
      bool progress = !header_done() && header_step(src, slen, sent);
      if (sent < slen && header_sent_ == out_prefix_) {
        size_t k = right_->try_send(src + sent, std::min(chunk_, slen - sent));
        sent += k;
        progress = progress || k > 0;
      }
      if (recvd < rlen && header_recvd_ == in_prefix_) {
        auto v = left_->peek();
        size_t take = std::min({v.size(), rlen - recvd, chunk_});
        take -= take % es;
        if (take > 0) {
          on_recv(recvd, v.data(), take);
          left_->consume(take);
          recvd += take;
          progress = true;
        }
      }
      if (progress) {
        w.idle = 0;
        continue;
      }
      const bool sending = sent < slen || header_sent_ < out_prefix_;
      const bool receiving = recvd < rlen || header_recvd_ < in_prefix_;
      wait(w, ticket, dl, sending ? right_.get() : nullptr, receiving ? left_.get() : nullptr,
           [&] {
             if (header_recvd_ < in_prefix_) return awaiting_header();
             if (receiving)
               return fmt::format(
                   "waiting for data from peer rank {} over {} ({} step {}/{}: {} of {} bytes "
                   "received, {} of {} sent)",
                   left_->peer(), left_->kind(), d.phase, d.step + 1, d.steps, recvd, rlen, sent, slen);
             return fmt::format(
                 "waiting for peer rank {} to take data over {} ({} step {}/{}: {} of {} bytes sent)",
                 right_->peer(), right_->kind(), d.phase, d.step + 1, d.steps, sent, slen);
           });
    }
  }

  void end_messages() {
    right_->end_message();
    if (left_ != right_) left_->end_message();
  }

  void ring_all_reduce(uint8_t* data, size_t count, DType dt, ReduceOp op, TimePoint dl) {
    const int n = size(), r = rank();
    const size_t es = dtype_size(dt);
    auto off = [&](int j) { return count * static_cast<size_t>(j) / static_cast<size_t>(n) * es; };
    auto len = [&](int j) { return off(j + 1) - off(j); };
    for (int s = 0; s < n - 1; ++s) {
      int sj = mod(r - s - 1), rj = mod(r - s - 2);
      uint8_t* dst = data + off(rj);
      exchange(data + off(sj), len(sj), len(rj), es,
               [&](size_t o, const uint8_t* p, size_t l) { reduce_inplace(dt, op, dst + o, p, l / es); },
               dl, {"reduce-scatter", s, n - 1});
    }
    if (op == ReduceOp::kAvg) avg_finish(dt, data + off(r), len(r) / es, n);
    for (int s = 0; s < n - 1; ++s) {
      int sj = mod(r - s), rj = mod(r - s - 1);
      uint8_t* dst = data + off(rj);
      exchange(data + off(sj), len(sj), len(rj), es,
               [&](size_t o, const uint8_t* p, size_t l) { std::memcpy(dst + o, p, l); }, dl,
               {"all-gather", s, n - 1});
    }
    end_messages();
  }

  // The data flows from the root onwards, but every rank sends its call's header to its
  // right neighbour and checks its left one's, the root and the rank before it included:
  // two ranks that each take themselves for the root would otherwise send and never receive.
  void ring_broadcast(uint8_t* data, size_t bytes, int root, TimePoint dl) {
    const bool forward = mod(rank() + 1) != root;
    size_t recvd = rank() == root ? bytes : 0, sent = 0;
    const size_t to_send = forward ? bytes : 0;
    Waiter w;
    while (!header_done() || sent < to_send || recvd < bytes) {
      uint32_t ticket = bell_ticket();
      bool progress = !header_done() && header_step(data, std::min(recvd, to_send), sent);
      if (header_sent_ == out_prefix_ && sent < recvd && sent < to_send) {
        size_t k = right_->try_send(data + sent, std::min(chunk_, recvd - sent));
        sent += k;
        progress = progress || k > 0;
      }
      if (recvd < bytes && header_recvd_ == in_prefix_) {
        auto v = left_->peek();
        size_t take = std::min({v.size(), bytes - recvd, chunk_});
        if (take > 0) {
          std::memcpy(data + recvd, v.data(), take);
          left_->consume(take);
          recvd += take;
          progress = true;
        }
      }
      if (progress) {
        w.idle = 0;
        continue;
      }
      const bool sending = (sent < to_send && sent < recvd) || header_sent_ < out_prefix_;
      const bool receiving = recvd < bytes || header_recvd_ < in_prefix_;
      wait(w, ticket, dl, sending ? right_.get() : nullptr, receiving ? left_.get() : nullptr, [&] {
             if (header_recvd_ < in_prefix_) return awaiting_header();
             if (receiving)
               return fmt::format("waiting for data from peer rank {} over {} (broadcast from root "
                                  "{}: {} of {} bytes received)",
                                  left_->peer(), left_->kind(), root, recvd, bytes);
             return fmt::format("waiting for peer rank {} to take data over {} (broadcast from "
                                "root {}: {} of {} bytes sent)",
                                right_->peer(), right_->kind(), root, sent, bytes);
           });
    }
    end_messages();
  }

  // ---- flat shared-memory algorithm (every rank on this host) --------------------------
  // Where a slot's data begins, for a call whose message is `size` bytes: right after the
  // header, in its cache line, when it fits there (a peer reads one line for both), else
  // on the next line. Peers in the same call agree on it; a peer in another call is told by
  // the header, checked before any data is read.
  uint8_t* flat_data(uint32_t k, int local, size_t size) {
    return seg_->flat_slot(k, local) + (size <= kFlatHeaderBytes - sizeof(CallHeader) ? sizeof(CallHeader)
                                                                                       : kFlatHeaderBytes);
  }

  // Posts this rank's header and `bytes` of data into its slot of a call of `size` bytes.
  uint32_t flat_post(const void* data, size_t bytes, size_t size) {
    uint32_t k = ++flat_seq_;
    std::memcpy(seg_->flat_slot(k, my_local_), &header_out_, sizeof header_out_);
    if (bytes) std::memcpy(flat_data(k, my_local_, size), data, bytes);
    seg_->rank(my_local_).flat_posted.store(k, std::memory_order_release);
    for (auto& p : peers_) ring_bell(seg_->rank(p.local).bell);
    return k;
  }

  // Every rank posts its whole buffer; each reduces all slots in rank order (identical
  // results everywhere).
  void flat_all_reduce(uint8_t* data, size_t count, DType dt, ReduceOp op, TimePoint dl) {
    const int n = size();
    const size_t bytes = count * dtype_size(dt);
    uint32_t k = flat_post(data, bytes, bytes);
    flat_wait_all(k, dl);
    reduce_into(dt, op, data, flat_data(k, 0, bytes), flat_data(k, 1, bytes), count);
    for (int p = 2; p < n; ++p) reduce_inplace(dt, op, data, flat_data(k, p, bytes), count);
    if (op == ReduceOp::kAvg) avg_finish(dt, data, count, n);
  }

  // Waits until every peer posted flat exchange k, then checks the calls in their headers.
  void flat_wait_all(uint32_t k, TimePoint dl) {
    flat_wait_all(k, dl, [&](int peer) {
      return fmt::format("waiting for peer rank {} to join {} (collective #{} of this group, flat shared-memory "
                         "algorithm)",
                         peer, call_.describe(), call_.seq);
    });
  }

  template <class Describe>
  void flat_wait_all(uint32_t k, TimePoint dl, Describe&& describe) {
    Waiter w;
    size_t next = 0;  // peers_[0..next) have posted
    for (;;) {
      uint32_t ticket = bell_ticket();
      while (next < peers_.size() && posted(peers_[next], k)) ++next;
      if (next == peers_.size()) {
        flat_waiting_k_ = 0;
        // A peer may have posted and then given up (e.g. timed out): do not use its data.
        for (auto& p : peers_)
          if (seg_->rank(p.local).aborted.load(std::memory_order_acquire) == kRankFailed)
            throw CollectiveError(fmt::format("peer rank {} (this host) failed", p.rank));
        check_flat_headers(k);
        return;
      }
      flat_waiting_k_ = k;
      wait(w, ticket, dl, nullptr, nullptr, [&] { return describe(peers_[next].rank); });
    }
  }

  bool posted(const LocalPeer& p, uint32_t k) const {
    return static_cast<int32_t>(seg_->rank(p.local).flat_posted.load(std::memory_order_acquire) - k) >= 0;
  }

  // ---- slice shared-memory all-reduce (every rank on this host) ------------------------
  // Stage after stage: copy in (all but this rank's own slice, which is read in place),
  // barrier, reduce own slice of every input into the result area, barrier, copy out.
  // The next stage's copy-in follows the barrier after which nobody reads the staging areas
  // any more, and its reduce follows the barrier after which nobody still copies out, so
  // one staging area per rank and one result area suffice.
  void slice_all_reduce(uint8_t* data, size_t count, DType dt, ReduceOp op, TimePoint dl) {
    const int n = size(), r = my_local_;
    const size_t es = dtype_size(dt);
    const size_t per_stage = seg_->slice_bytes() / es;  // elements (slice_bytes % 64 == 0)
    const size_t align = std::max<size_t>(1, 64 / es);  // slice starts on 64-byte lines
    const size_t stages = (count + per_stage - 1) / per_stage;
    uint8_t* const out_area = seg_->slice_out();
    for (size_t st = 0; st < stages; ++st) {
      const size_t base = st * per_stage, m = std::min(per_stage, count - base);
      auto off = [&](int j) {
        return j >= n ? m : m * static_cast<size_t>(j) / static_cast<size_t>(n) / align * align;
      };
      uint8_t* const src = data + base * es;
      uint8_t* const mine = seg_->slice_in(r);
      const size_t lo = off(r) * es, hi = off(r + 1) * es, all = m * es;
      if (lo) std::memcpy(mine, src, lo);
      if (hi < all) std::memcpy(mine + hi, src + hi, all - hi);
      auto describe = [&](const char* phase) {
        return [&, phase](int peer) {
          return fmt::format("waiting for peer rank {} ({} of slice all-reduce stage {}/{}, "
                             "shared memory)",
                             peer, phase, st + 1, stages);
        };
      };
      flat_wait_all(flat_post(nullptr, 0, 0), dl, describe("copy-in"));
      if (hi > lo) {
        const size_t len = (hi - lo) / es;
        auto in = [&](int p) -> const uint8_t* { return p == r ? src + lo : seg_->slice_in(p) + lo; };
        uint8_t* res = out_area + lo;
        reduce_into(dt, op, res, in(0), in(1), len);
        for (int p = 2; p < n; ++p) reduce_inplace(dt, op, res, in(p), len);
        if (op == ReduceOp::kAvg) avg_finish(dt, res, len, n);
      }
      flat_wait_all(flat_post(nullptr, 0, 0), dl, describe("reduce"));
      std::memcpy(src, out_area, all);
    }
  }

  ProcessGroupOptions opts_;
  std::shared_ptr<Store> store_;
  std::string name_;
  size_t chunk_;
  size_t small_;
  uint64_t tag_ = 0;
  std::vector<int> local_;  // global ranks sharing memory with this one (sorted)
  int my_local_ = -1;
  bool all_local_ = false;
  std::unique_ptr<ShmSegment> seg_;
  Bell* my_bell_ = nullptr;
  std::vector<LocalPeer> peers_;
  std::shared_ptr<Link> right_, left_;
  uint32_t flat_seq_ = 0;
  // The call check: this rank's call, its header, and how much of it and of the left
  // neighbour's has crossed.
  uint64_t calls_ = ~uint64_t{0};  // the set-up barrier is #0, the caller's first collective #1
  CallDesc call_;
  CallHeader header_out_, header_in_;
  size_t header_sent_ = 0, header_recvd_ = 0;
  size_t out_prefix_ = sizeof(CallHeader), in_prefix_ = sizeof(CallHeader);  // header + padding
  std::array<uint8_t, CallHeader::kPaddedBytes> header_prefix_{};  // zeros after the header
  bool published_ = false;     // this call is in this rank's RankCtl::call
  bool failed_ = false;        // fail_locally ran: the group ends without leave()
  uint32_t flat_waiting_k_ = 0;  // the flat exchange this rank waits in, 0: none
  std::vector<uint8_t> tmp_[2];
  std::vector<uint8_t> scaled_;  // a reduce-scatter's input, scaled for an average (kept up to 64 MiB)
};

}  // namespace

std::unique_ptr<ProcessGroup> make_cpu_group(const ProcessGroupOptions& o) {
  return std::make_unique<CpuGroup>(o);
}

}  // namespace ddp::detail
