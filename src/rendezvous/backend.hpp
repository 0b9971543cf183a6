// The dynamic rendezvous's storage, as a small interface (torch splits its
// DynamicRendezvousHandler from its backends the same way). Backends:
//   StoreBackend   ddprun's TCP store (--rdzv-backend c10d): store_backend.hpp
//   MemoryBackend  in-process, with a fake clock for leases (unit tests): memory_backend.hpp
//   EtcdBackend    etcd's v3 API (--rdzv-backend etcd)
//
// A backend serves ONE run id: every name below is relative to that run (the backend puts
// it under its own per-run prefix) and nothing outside the prefix is ever written.
//
// What it offers, and nothing more:
//   - the state: one opaque value, replaced only if unchanged since a token (compare-and-set);
//   - logs: append-only lists of lines (round events, the list of lost nodes, ...), whose
//     first lines can be dropped once nobody needs them;
//   - counters;
//   - a lease: this node's liveness. When this process dies, its connection closes, or it
//     stops renewing the lease for the lease's ttl, the backend appends the lines registered
//     with on_lease_end() to their logs. Every other node then reads them like any line.
//
// Every call is bounded: it returns or throws within the backend's operation timeout
// (read_timeout), never blocks forever. Errors are ddp::Error subclasses naming the
// backend (describe()) and what was being done; a backend that cannot be reached throws
// ddp::NetworkError or ddp::TimeoutError.
//
// Thread safety: a backend object is used by one thread at a time. The rendezvous uses
// one backend object per thread (clone()): the main thread's and the watcher's.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/error.hpp"

namespace ddprun::rdzv {

// keep_alive's error when the lease has certainly ended (the others have been told this
// node is lost); any other error from keep_alive may be passing.
class LeaseEnded : public ddp::NetworkError {
 public:
  using ddp::NetworkError::NetworkError;
};

// next_round's error when the job ended well while this node waited for a place in it
// (wait or redundancy list): nothing failed, the job did not need it (torchrun 2.x's
// RendezvousGracefulExitError). ddprun exits 0.
class NotNeeded : public ddp::Error {
 public:
  using ddp::Error::Error;
};

// read/wait's error when the lines asked for begin before the first line the log still
// holds (trim_log dropped them): the reader resumes from first() (a cursor that fell behind),
// or starts over from a newer state (a state's line number that is out of date).
class LogTrimmed : public ddp::Error {
 public:
  LogTrimmed(const std::string& what, size_t first) : ddp::Error(what), first_(first) {}
  size_t first() const { return first_; }

 private:
  size_t first_;
};

using std::chrono::milliseconds;

// An opaque version of the state as the backend hands it out (the whole value for a
// store, a revision for etcd). Only the backend that made it interprets it.
struct Token {
  std::string value;
  bool operator==(const Token&) const = default;
};

struct Snapshot {
  std::optional<std::string> state;  // nullopt: no state written yet for this run
  Token token;                       // pass to compare_and_set to replace exactly this
};

struct CasResult {
  bool ok = false;    // true: our value was written
  Snapshot current;   // the state now: ours (ok) or the one that won (not ok)
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "c10d store at head:29400", "etcd at 10.0.0.1:2379,10.0.0.2:2379": for messages.
  virtual std::string describe() const = 0;

  // A second connection to the same backend and run, for another thread. The clone has
  // no lease of its own (open_lease is called on one object only).
  virtual std::unique_ptr<Backend> clone() const = 0;

  // ---- the state ---------------------------------------------------------------------
  virtual Snapshot load() = 0;
  // Writes `value` if the state is still what `expected` names (an empty token names "no
  // state yet"). On conflict nothing is written and current is the winner's.
  virtual CasResult compare_and_set(const std::string& value, const Token& expected) = 0;
  // Whether the state is still the one `t` names, found out without fetching it (the
  // store: the version at its end): false when unchanged. nullopt when this backend cannot
  // tell without a load (the default). A waiting node loads the state only when it changed.
  virtual std::optional<bool> changed(const Token& t) {
    (void)t;
    return std::nullopt;
  }

  // ---- logs (append-only lists of lines; a line holds no '\n') -----------------------
  virtual void append(const std::string& log, const std::string& line) = 0;
  // Lines [from, end); empty if the log has no more (or does not exist). LogTrimmed when
  // line `from` was dropped (trim_log).
  virtual std::vector<std::string> read(const std::string& log, size_t from) = 0;
  // As read(log, from), where `at` is where line `from` begins as another object of this
  // backend saw it (position(); -1: unknown): an object that has not read the log that far
  // starts there, not at the log's first line. (A joiner reads the requests from the
  // state's count on: without it, each of N joiners would fetch the N lines before.)
  virtual std::vector<std::string> read(const std::string& log, size_t from, int64_t at) {
    (void)at;
    return read(log, from);
  }
  // Where line `line` of `log` begins, in this backend's own terms (the store: the byte
  // offset), when this object has read that far; -1 when it cannot tell.
  virtual int64_t position(const std::string& log, size_t line) {
    (void)log;
    (void)line;
    return -1;
  }
  // Lines [from, end) once there is at least one, waiting up to `timeout`; empty at the
  // timeout. Every node sees the same lines in the same order.
  virtual std::vector<std::string> wait(const std::string& log, size_t from, milliseconds timeout) = 0;

  // Drops lines [0, upto) of a log (those nobody reads any more): the log holds what its
  // readers still need, not the job's whole history. Lines keep their numbers (line upto is
  // still line upto); a read or wait from a dropped line throws LogTrimmed. Dropping fewer
  // lines than before, or more than the log has, drops what it can. Returns false when
  // this backend cannot drop lines (a store server without the extension): nothing changed.
  virtual bool trim_log(const std::string& log, size_t upto) = 0;

  // Removes a log that nobody reads any more (a finished round's): a long job's state does
  // not grow with its age. Removing a missing log is no error.
  virtual void drop_log(const std::string& log) = 0;

  // ---- counters ----------------------------------------------------------------------
  // Adds delta to the counter (0 if it does not exist) and returns the new value.
  virtual int64_t add(const std::string& counter, int64_t delta) = 0;
  virtual void drop_counter(const std::string& counter) = 0;

  // ---- this node's lease -------------------------------------------------------------
  // Starts the lease: it ends when this process dies, when close() is called, or when no
  // keep_alive() arrives within ttl. Call once, before on_lease_end.
  virtual void open_lease(milliseconds ttl) = 0;
  // Renews the lease within `timeout`. Throws LeaseEnded when the lease has ended (this node
  // has been declared lost: it must stop), another ddp::Error when the backend could not
  // be reached in time (the lease may still be alive: try again).
  virtual void keep_alive(milliseconds timeout) = 0;
  // When the lease ends, `line` is appended to `log`, followed by " " and why (e.g.
  // "connection closed", "no keep-alive for 15 s"). Lines registered earlier stay
  // registered.
  virtual void on_lease_end(const std::string& log, const std::string& line) = 0;
  // Forgets the lines registered for `log` (a finished round's): one registration per
  // round, not one more every round.
  virtual void drop_lease_end(const std::string& log) = 0;

  // Ends the lease now (its lines are appended, as for any end) and closes connections.
  virtual void close() = 0;
  // Ends the lease in good order: its lines are NOT appended (a node that leaves a finished
  // job: nobody needs to hear it is gone, and a thousand such lines would only wake a
  // thousand watchers). The default writes them (close()).
  virtual void release() { close(); }

  // Makes a wait() in progress on this object (in another thread) return soon, and every
  // later call fail: for shutting a watcher thread down without waiting out its slice.
  // Callable from any thread. The default does nothing (the wait runs out its timeout).
  virtual void interrupt() {}
  // Makes a wait() in progress on this object (in another thread), or the next one, return
  // now as at its timeout; later calls work as before: a stopping node's wait ends without
  // losing the connection it still needs. Callable from any thread. The default does
  // nothing (the wait runs out its timeout).
  virtual void wake() {}
};

}  // namespace ddprun::rdzv
