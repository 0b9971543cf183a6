// The c10d TCPStore wire protocol, both generations (docs/store.md,
// ../shared/reference/tcpstore-wire.md): opcodes, an incremental request parser shared by
// the server and the fuzzer, and the little-endian encoders used by clients and the server.
//
// This file and protocol.cpp depend on the standard library only, so that the fuzz target
// can be built from them alone with clang.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::detail::proto {

// Generation 2 starts every connection with VALIDATE: 0x00 then this u32 (CE F7 85 3C).
inline constexpr uint32_t kValidationMagic = 0x3C85F7CE;

enum class Generation : uint8_t {
  kUnknown,    // not decided yet: the parser decides from the first bytes
  kV1,         // no handshake; torch 1.13 .. 2.0 numbering (WATCH_KEY=7 DELETE_KEY=8)
  kV2,         // torch 2.2+ (VALIDATE first)
  kV1Torch21,  // no handshake; torch 2.1's numbering (no WATCH_KEY; DELETE_KEY=7 .. CANCEL_WAIT=11)
};

// Generation 1 in either numbering (no handshake, GET of a missing key is an error).
inline bool is_gen1(Generation g) { return g == Generation::kV1 || g == Generation::kV1Torch21; }

// Operations, independent of their opcode in either generation.
enum class Op : uint8_t {
  kValidate,
  kPing,
  kSet,
  kCompareSet,
  kGet,
  kAdd,
  kCheck,
  kWait,
  kGetNumKeys,
  kWatchKey,
  kDeleteKey,
  kAppend,
  kMultiGet,
  kMultiSet,
  kCancelWait,
  kQueuePush,
  kQueuePop,
  kQueueLen,
  kList,     // torch calls it LIST_KEYS
  kBarrier,  // generation 2 only; torch main since PyTorch PR #174920 (2026-02)
  // ddprun's own extensions (generation 2, opcodes 0x60.., docs/store.md): what the dynamic
  // rendezvous needs to notice a node leave at once. PyTorch's servers close the
  // connection on them.
  kLease,       // i64 ttl in ms: the connection ends (and its lease lines are written) when
                // it closes or sends no request for ttl (0: only when it closes); a negative
                // ttl releases the lease: its lines are dropped, never written. Reply u8 0.
  kOnLeaseEnd,  // key, value: when the connection's lease ends, APPEND value + why + "\n" to
                // key (waking its waiters). Reply u8 0.
  kWaitGrows,   // key, i64 n: reply kWaitStopWaiting once the key's value is longer than n
                // bytes (a missing key is 0 bytes long); CANCEL_WAIT cancels it like a WAIT.
  kGetFrom,     // key, i64 offset: reply the value's bytes from offset on (a string: "" when
                // the key is missing or not longer than offset); never waits. Offsets count
                // from the key's first byte ever (TRIM_LOG keeps them). Offset -1 asks for
                // the server's features: "log-trim" (servers before it read -1 as 0: ask
                // with a key that does not exist, and they reply "").
  kTrimLog,     // key, i64 n: drops the value's '\n'-ended lines before line n (lines count
                // from the key's first ever); offsets and line numbers stay. Reply i64: the
                // first line still held.
  kLogFrom,     // key, i64 offset: reply i64 trimmed bytes, i64 trimmed lines, then the
                // value's bytes from max(offset, trimmed bytes) on (a string); never waits.
};

// GET_FROM's offset that asks for the server's features, and the reply naming log trimming.
inline constexpr int64_t kFeaturesOffset = -1;
inline constexpr char kFeatureLogTrim[] = "log-trim";

// First opcode of ddprun's extensions in generation 2.
inline constexpr uint8_t kExtensionBase = 0x60;

const char* op_name(Op op);

// Opcode tables (docs/store.md):
//   kV1         SET0 COMPARE_SET1 GET2 ADD3 CHECK4 WAIT5 GETNUMKEYS6 WATCH_KEY7 DELETE_KEY8, and
//               an unreleased 2.0-era main's APPEND9 MULTI_GET10 MULTI_SET11 CANCEL_WAIT12
//   kV1Torch21  SET0 ... GETNUMKEYS6 DELETE_KEY7 APPEND8 MULTI_GET9 MULTI_SET10 CANCEL_WAIT11
//   kV2         VALIDATE0 SET1 ... CANCEL_WAIT12 PING13 QUEUE_PUSH14 QUEUE_POP15 QUEUE_LEN16
//               LIST_KEYS17 BARRIER18, and ddprun's LEASE 0x60 ON_LEASE_END 0x61 WAIT_GROWS 0x62
//               GET_FROM 0x63 TRIM_LOG 0x64 LOG_FROM 0x65
// The parser does not use the kV1 table as is: it tells torch 2.1 apart per connection (see
// RequestParser).
//
// The operation behind a wire opcode in that table; nullopt if it has no such opcode.
// Generation must not be kUnknown.
std::optional<Op> decode_opcode(Generation g, uint8_t opcode);
// The wire opcode of an operation; nullopt if the generation lacks it (PING in gen 1...).
std::optional<uint8_t> encode_opcode(Generation g, Op op);

// Reply codes.
inline constexpr uint8_t kCheckReady = 0, kCheckNotReady = 1;
inline constexpr uint8_t kWaitStopWaiting = 0, kWaitCanceled = 1;
inline constexpr uint8_t kWatchUpdated = 0, kWatchCreated = 1, kWatchDeleted = 2,
                         kWatchRegistered = 3;

// One decoded request. Field usage by operation:
//   keys    the key fields in wire order (SET/GET/... one; CHECK/WAIT/MULTI_GET/MULTI_SET n)
//   values  the payload fields in wire order (SET/APPEND/QUEUE_PUSH one value; COMPARE_SET
//           expected then desired; MULTI_SET one per key)
//   i64     ADD's delta, BARRIER's world size, LEASE's ttl, WAIT_GROWS's size, GET_FROM's
//           and LOG_FROM's offset, TRIM_LOG's line
//   u32     VALIDATE's magic, PING's nonce
struct Request {
  Op op = Op::kGetNumKeys;
  std::vector<std::string> keys;
  std::vector<std::string> values;
  int64_t i64 = 0;
  uint32_t u32 = 0;
};

// A request with the fields its opcode uses (the client, tests and the load generator).
inline Request request(Op op, std::vector<std::string> keys = {}, std::vector<std::string> values = {},
                       int64_t i64 = 0, uint32_t u32 = 0) {
  return Request{op, std::move(keys), std::move(values), i64, u32};
}

// Per-field limits are the libuv server's. PyTorch has no per-request total, so by default
// neither do we: the parser never allocates on a declared length, so a request only ever
// holds the bytes that actually arrived, and a legal MULTI_SET (up to 128 Ki x 8 MiB) must
// not be refused.
struct Limits {
  size_t max_key_bytes = 8 << 10;
  size_t max_payload_bytes = 8 << 20;
  size_t max_keys_per_request = 128 << 10;
  // Sum of the declared string lengths of one request; no limit by default.
  size_t max_request_bytes = std::numeric_limits<size_t>::max();
};

// Incremental (push) parser of a client's request stream. Bytes can be fed in pieces of
// any size, down to one byte; each byte is looked at once and copied at most once (into
// the field it belongs to), so a request split over many TCP segments costs no more than
// one that arrives whole.
//
// With Generation::kUnknown the generation is decided from the first bytes: 0x00 followed
// by CE F7 85 3C is generation 2 (and yields a VALIDATE request), anything else is
// generation 1. Nothing is decided before the first byte arrives.
//
// Generation 1 (kV1, given or detected) then tells torch 2.1's numbering apart per
// connection, from the opcodes it sees:
//  - opcode 9, 10 or 11 (MULTI_GET, MULTI_SET, CANCEL_WAIT in 2.1; torch <= 2.0 never sends
//    them) switches the connection to kV1Torch21 for good, as does opcode 7 on a connection
//    whose first request was not opcode 7 (2.1's DELETE_KEY);
//  - a first request with opcode 7 is torch 1.13's WATCH_KEY on its "callback" connection:
//    the connection stays kV1 for good and speaks opcodes 0-8 and 12 only;
//  - before any evidence, opcode 8 is DELETE_KEY (1.13) and 12 CANCEL_WAIT (2.0-era).
// Residual ambiguities: a 2.1 client's APPEND (8) before any 2.1-only request is read as
// DELETE_KEY, and a 2.1 client whose very first request is DELETE_KEY (7) is taken for a
// callback connection. Requests parsed before the switch keep their meaning.
class RequestParser {
 public:
  enum class Status {
    kNeedMore,  // every byte given was consumed, no request is complete yet
    kReady,     // a request is complete: take() it; bytes after it were not consumed
    kError,     // the stream is invalid (error() says why); the parser stays in error
  };

  explicit RequestParser(Limits limits = {}, Generation generation = Generation::kUnknown);

  // Consumes bytes of [data, data + size) up to the end of the next complete request;
  // `consumed` is set to the number of bytes used.
  Status feed(const uint8_t* data, size_t size, size_t& consumed);
  Request take();

  Generation generation() const { return gen_; }
  const std::string& error() const { return error_; }
  // True when no partial request is buffered (between requests).
  bool idle() const { return stage_ == Stage::kOpcode || stage_ == Stage::kDetect; }

 private:
  enum class Stage : uint8_t { kDetect, kOpcode, kFixed, kStrBody, kReady, kError };
  enum class Field : uint8_t { kU32, kI64, kCount, kKey, kValue };

  Status fail(std::string why);
  std::optional<Op> decode(uint8_t opcode);  // decode_opcode plus the torch 2.1 detection
  bool begin_op(uint8_t opcode);   // false: error set
  bool next_field();               // starts the next field, or sets kReady; false: error
  bool on_fixed_complete();        // false: error set
  bool field_done();               // a field finished; false: error
  Status feed_detect(const uint8_t* data, size_t size, size_t& consumed);

  Limits limits_;
  Generation gen_;
  Stage stage_;
  std::string error_;
  Request req_;

  // Schema of the current operation.
  const Field* fields_ = nullptr;
  uint8_t nfields_ = 0;
  const Field* group_ = nullptr;  // repeated `count` times after the fields
  uint8_t ngroup_ = 0;
  uint8_t field_idx_ = 0;
  uint8_t group_idx_ = 0;
  bool in_group_ = false;
  uint64_t groups_left_ = 0;
  Field cur_ = Field::kU32;

  // Fixed-size integer being read (or the u64 length of a string).
  uint8_t fixed_[8] = {};
  uint8_t fixed_need_ = 0, fixed_have_ = 0;
  bool reading_len_ = false;  // fixed_ holds a string length (cur_ is kKey/kValue)
  std::string* str_ = nullptr;
  uint64_t str_left_ = 0;
  uint64_t req_bytes_ = 0;

  // Generation detection: bytes seen so far of a possible VALIDATE.
  uint8_t detect_[5] = {};
  uint8_t detect_len_ = 0;
  // Generation-1 numbering detection.
  bool v1_started_ = false;   // a request has begun on this connection
  bool v1_callback_ = false;  // the first request was WATCH_KEY: torch 1.13 for good
};

// Encoders: raw little-endian (host order on x86-64) integers and u64-length strings.
void put_u8(std::string& out, uint8_t v);
void put_u32(std::string& out, uint32_t v);
void put_u64(std::string& out, uint64_t v);
void put_i64(std::string& out, int64_t v);
void put_str(std::string& out, std::string_view s);

// Appends a whole request (opcode and fields as Request documents them). Throws
// std::invalid_argument if the generation lacks the operation.
void encode_request(Generation g, const Request& r, std::string& out);

// PyTorch's std::stoll: optional leading whitespace and sign, then digits; trailing bytes
// are ignored. nullopt if there are no digits or the value overflows.
std::optional<int64_t> parse_counter(std::string_view text);

}  // namespace ddp::detail::proto
