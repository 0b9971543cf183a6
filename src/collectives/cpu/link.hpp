// A point-to-point byte stream between this rank and one peer (internal to the CPU backend).
// Non-blocking: try_send copies what fits, peek shows what has arrived. Both ends call
// end_message() after every collective so that the next one starts aligned.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace ddp::detail {

class Link {
 public:
  explicit Link(int peer) : peer_(peer) {}
  virtual ~Link() = default;
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  int peer() const { return peer_; }
  virtual const char* kind() const = 0;  // "shared memory", "tcp"
  // Copies up to n bytes into the link; returns how many (0: full right now).
  virtual size_t try_send(const uint8_t* p, size_t n) = 0;
  // The same for a's na bytes followed by b's nb (TCP: one send, so one packet for both).
  virtual size_t try_send2(const uint8_t* a, size_t na, const uint8_t* b, size_t nb) {
    size_t k = try_send(a, na);
    return k == na && nb ? k + try_send(b, nb) : k;
  }
  // Received bytes not yet consumed (may be empty). Throws CollectiveError if the peer is
  // gone and nothing is left.
  virtual std::span<const uint8_t> peek() = 0;
  virtual void consume(size_t n) = 0;
  virtual void end_message() {}
  // Socket to poll, or -1 (shared memory: wait on this rank's doorbell instead).
  virtual int fd() const { return -1; }
  // Makes the peer see end-of-stream at once (used when this rank fails).
  virtual void shutdown() noexcept {}
  // This rank destroys its group between two collectives: the n bytes at p (a CallHeader
  // that says so) go to the peer if they fit at once, so that a peer still waiting for a
  // call reads why none comes. What the peer sent is read first (a close over unread bytes
  // would reset the connection, and the peer could lose the header).
  virtual void leave(const uint8_t* /*p*/, size_t /*n*/) noexcept {}
  // True once the peer closed the stream (what is buffered can still be read).
  virtual bool at_eof() const { return false; }
  // Called when this rank waits on a stream at EOF: what is buffered (if anything) cannot
  // complete an element, and nothing more will come. Throws CollectiveError (a link that
  // never reaches EOF has nothing to do).
  virtual void fail_at_eof() {}

 private:
  int peer_;
};

}  // namespace ddp::detail
