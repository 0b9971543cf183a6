// Unit tests of the incremental request parser and the encoders (src/store/protocol.*).
#include <chrono>
#include <cstring>

#include <gtest/gtest.h>

#include "store/protocol.hpp"
#include "test_timeouts.hpp"

namespace proto = ddp::detail::proto;
using proto::Generation;
using proto::Op;
using Status = proto::RequestParser::Status;

namespace {

using proto::request;

std::string encode(Generation g, const proto::Request& r) {
  std::string s;
  proto::encode_request(g, r, s);
  return s;
}

const uint8_t* bytes(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

// Feeds `stream` in pieces of `chunk` bytes; returns the requests parsed and the final status.
struct Parsed {
  std::vector<proto::Request> requests;
  Status last = Status::kNeedMore;
  std::string error;
  Generation gen = Generation::kUnknown;
};
Parsed parse(const std::string& stream, size_t chunk, Generation g = Generation::kUnknown,
             proto::Limits limits = {}) {
  proto::RequestParser p(limits, g);
  Parsed out;
  for (size_t off = 0; off < stream.size();) {
    size_t n = std::min(chunk, stream.size() - off);
    size_t pos = 0;
    while (pos < n) {
      size_t used = 0;
      out.last = p.feed(bytes(stream) + off + pos, n - pos, used);
      pos += used;
      if (out.last == Status::kReady) {
        out.requests.push_back(p.take());
      } else if (out.last == Status::kError) {
        out.error = p.error();
        out.gen = p.generation();
        return out;
      } else {
        EXPECT_EQ(pos, n) << "kNeedMore must consume everything";
        break;
      }
    }
    off += n;
  }
  out.gen = p.generation();
  return out;
}

void expect_same(const proto::Request& a, const proto::Request& b) {
  EXPECT_EQ(a.op, b.op) << proto::op_name(a.op) << " vs " << proto::op_name(b.op);
  EXPECT_EQ(a.keys, b.keys);
  EXPECT_EQ(a.values, b.values);
  EXPECT_EQ(a.i64, b.i64);
  EXPECT_EQ(a.u32, b.u32);
}

// Every request of a generation, in an order that a connection can send them in: torch
// 1.13's main connection (kV1: no WATCH_KEY, no 2.0-era opcodes 9-11), torch 2.1's (its
// DELETE_KEY comes before its APPEND, so the numbering is known by then), generation 2.
std::vector<proto::Request> all_requests(Generation g) {
  std::vector<proto::Request> v = {
      request(Op::kSet, {"key"}, {std::string("v\0al", 4)}),
      request(Op::kCompareSet, {"k"}, {"", "desired"}),
      request(Op::kGet, {"k"}),
      request(Op::kAdd, {"counter"}, {}, -42),
      request(Op::kCheck, {"a", "bb", ""}),
      request(Op::kWait, {"x"}),
      request(Op::kWait, {}),
      request(Op::kGetNumKeys),
      request(Op::kDeleteKey, {"k"}),
  };
  if (g != Generation::kV1) {
    v.push_back(request(Op::kAppend, {"k"}, {"tail"}));
    v.push_back(request(Op::kMultiGet, {"a", "b"}));
    v.push_back(request(Op::kMultiSet, {"a", "b"}, {"1", ""}));
  }
  v.push_back(request(Op::kCancelWait));  // generation 1: 12 (2.0-era) or 11 (2.1)
  if (g == Generation::kV2) {
    v.push_back(request(Op::kPing, {}, {}, 0, 1234));
    v.push_back(request(Op::kQueuePush, {"q"}, {"item"}));
    v.push_back(request(Op::kQueuePop, {"q"}));
    v.push_back(request(Op::kQueueLen, {"q"}));
    v.push_back(request(Op::kList));
    v.push_back(request(Op::kBarrier, {"b"}, {}, -3));
    v.push_back(request(Op::kLease, {}, {}, 15000));  // ddprun's extensions
    v.push_back(request(Op::kOnLeaseEnd, {"gone"}, {"node7 "}));
    v.push_back(request(Op::kWaitGrows, {"log"}, {}, 42));
    v.push_back(request(Op::kGetFrom, {"log"}, {}, 7));
    v.push_back(request(Op::kTrimLog, {"log"}, {}, 3));
    v.push_back(request(Op::kLogFrom, {"log"}, {}, 12));
  }
  return v;
}

}  // namespace

TEST(StoreProtocol, OpcodeTablesMatchTheWireReference) {
  EXPECT_EQ(proto::encode_opcode(Generation::kV1, Op::kSet), 0);
  EXPECT_EQ(proto::encode_opcode(Generation::kV1, Op::kWatchKey), 7);
  EXPECT_EQ(proto::encode_opcode(Generation::kV1, Op::kDeleteKey), 8);
  EXPECT_EQ(proto::encode_opcode(Generation::kV1, Op::kCancelWait), 12);
  EXPECT_FALSE(proto::encode_opcode(Generation::kV1, Op::kPing));
  EXPECT_FALSE(proto::encode_opcode(Generation::kV1, Op::kValidate));
  // torch 2.1: WATCH_KEY removed, everything after it one lower.
  EXPECT_EQ(proto::encode_opcode(Generation::kV1Torch21, Op::kGetNumKeys), 6);
  EXPECT_EQ(proto::encode_opcode(Generation::kV1Torch21, Op::kDeleteKey), 7);
  EXPECT_EQ(proto::encode_opcode(Generation::kV1Torch21, Op::kAppend), 8);
  EXPECT_EQ(proto::encode_opcode(Generation::kV1Torch21, Op::kMultiGet), 9);
  EXPECT_EQ(proto::encode_opcode(Generation::kV1Torch21, Op::kMultiSet), 10);
  EXPECT_EQ(proto::encode_opcode(Generation::kV1Torch21, Op::kCancelWait), 11);
  EXPECT_FALSE(proto::encode_opcode(Generation::kV1Torch21, Op::kWatchKey));
  EXPECT_FALSE(proto::encode_opcode(Generation::kV1Torch21, Op::kValidate));
  EXPECT_FALSE(proto::decode_opcode(Generation::kV1Torch21, 12));
  EXPECT_EQ(proto::encode_opcode(Generation::kV2, Op::kValidate), 0);
  EXPECT_EQ(proto::encode_opcode(Generation::kV2, Op::kSet), 1);
  EXPECT_EQ(proto::encode_opcode(Generation::kV2, Op::kGetNumKeys), 7);
  EXPECT_EQ(proto::encode_opcode(Generation::kV2, Op::kPing), 13);
  EXPECT_EQ(proto::encode_opcode(Generation::kV2, Op::kList), 17);  // LIST_KEYS
  EXPECT_EQ(proto::encode_opcode(Generation::kV2, Op::kBarrier), 18);
  EXPECT_FALSE(proto::encode_opcode(Generation::kV2, Op::kWatchKey));
  EXPECT_FALSE(proto::encode_opcode(Generation::kV1, Op::kBarrier));
  EXPECT_FALSE(proto::decode_opcode(Generation::kV1, 13));
  EXPECT_FALSE(proto::decode_opcode(Generation::kV2, 19));
  // ddprun's extensions: generation 2 only, far above torch's opcodes.
  EXPECT_EQ(proto::encode_opcode(Generation::kV2, Op::kLease), 0x60);
  EXPECT_EQ(proto::encode_opcode(Generation::kV2, Op::kOnLeaseEnd), 0x61);
  EXPECT_EQ(proto::encode_opcode(Generation::kV2, Op::kWaitGrows), 0x62);
  EXPECT_EQ(proto::encode_opcode(Generation::kV2, Op::kGetFrom), 0x63);
  EXPECT_EQ(proto::encode_opcode(Generation::kV2, Op::kTrimLog), 0x64);
  EXPECT_EQ(proto::encode_opcode(Generation::kV2, Op::kLogFrom), 0x65);
  EXPECT_FALSE(proto::decode_opcode(Generation::kV2, 0x66));
  EXPECT_FALSE(proto::encode_opcode(Generation::kV1, Op::kLease));
  EXPECT_FALSE(proto::decode_opcode(Generation::kV1Torch21, 0x60));
}

TEST(StoreProtocol, BarrierIsKeyThenWorldSize) {
  std::string expect("\x12\x02\x00\x00\x00\x00\x00\x00\x00/b\x03\x00\x00\x00\x00\x00\x00\x00", 19);
  EXPECT_EQ(encode(Generation::kV2, request(Op::kBarrier, {"/b"}, {}, 3)), expect);
}

TEST(StoreProtocol, EncodingIsLittleEndianWithU64Lengths) {
  // The ADD "init/" 1 that a torch 1.13 worker sends first (tcpstore-wire.md).
  std::string expect("\x03\x05\x00\x00\x00\x00\x00\x00\x00init/\x01\x00\x00\x00\x00\x00\x00\x00", 22);
  EXPECT_EQ(encode(Generation::kV1, request(Op::kAdd, {"init/"}, {}, 1)), expect);
  std::string validate("\x00\xCE\xF7\x85\x3C", 5);
  EXPECT_EQ(encode(Generation::kV2, request(Op::kValidate, {}, {}, 0, proto::kValidationMagic)),
            validate);
}

TEST(StoreProtocol, EveryRequestRoundTripsInOnePieceAndByteByByte) {
  for (auto g : {Generation::kV1, Generation::kV1Torch21, Generation::kV2}) {
    auto reqs = all_requests(g);
    std::string stream;
    if (g == Generation::kV2)
      stream = encode(g, request(Op::kValidate, {}, {}, 0, proto::kValidationMagic));
    for (auto& r : reqs) stream += encode(g, r);
    for (size_t chunk : {stream.size(), size_t{1}, size_t{3}, size_t{7}}) {
      SCOPED_TRACE("generation " + std::to_string(int(g)) + " chunk " + std::to_string(chunk));
      auto p = parse(stream, chunk);
      ASSERT_NE(p.last, Status::kError) << p.error;
      EXPECT_EQ(p.gen, g);
      size_t first = g == Generation::kV2 ? 1 : 0;
      ASSERT_EQ(p.requests.size(), reqs.size() + first);
      if (first) {
        EXPECT_EQ(p.requests[0].op, Op::kValidate);
      }
      for (size_t i = 0; i < reqs.size(); ++i) expect_same(p.requests[i + first], reqs[i]);
    }
  }
}

// Requests parsed from a generation-1 stream, the stream given as (numbering, request) pairs.
Parsed parse_v1(const std::vector<std::pair<Generation, proto::Request>>& reqs, size_t chunk) {
  std::string stream;
  for (auto& [g, r] : reqs) stream += encode(g, r);
  return parse(stream, chunk);
}

TEST(StoreProtocol, Gen1TellsTorch21NumberingApartPerConnection) {
  const auto v1 = Generation::kV1, v21 = Generation::kV1Torch21;
  for (size_t chunk : {size_t{1}, size_t{4096}}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    // torch 1.13's callback connection: WATCH_KEY first, and again later; 1.13 for good.
    auto p = parse_v1({{v1, request(Op::kWatchKey, {"a"})},
                       {v1, request(Op::kWatchKey, {"b"})},
                       {v1, request(Op::kDeleteKey, {"c"})}},
                      chunk);
    ASSERT_EQ(p.requests.size(), 3u) << p.error;
    EXPECT_EQ(p.requests[1].op, Op::kWatchKey);
    EXPECT_EQ(p.requests[2].op, Op::kDeleteKey);
    EXPECT_EQ(p.gen, v1);
    // ... where opcodes 9-11 do not exist.
    p = parse(encode(v1, request(Op::kWatchKey, {"a"})) + encode(v21, request(Op::kMultiGet, {"x"})),
              chunk);
    EXPECT_EQ(p.last, Status::kError);
    EXPECT_NE(p.error.find("unknown opcode 0x09 (wire generation 1)"), std::string::npos) << p.error;
    // Opcode 7 after another request: 2.1's DELETE_KEY; then 8 is APPEND.
    p = parse_v1({{v1, request(Op::kSet, {"k"}, {"v"})},
                  {v21, request(Op::kDeleteKey, {"k"})},
                  {v21, request(Op::kAppend, {"k"}, {"w"})}},
                 chunk);
    ASSERT_EQ(p.requests.size(), 3u) << p.error;
    expect_same(p.requests[1], request(Op::kDeleteKey, {"k"}));
    expect_same(p.requests[2], request(Op::kAppend, {"k"}, {"w"}));
    EXPECT_EQ(p.gen, v21);
    // 8 before any evidence is 1.13's DELETE_KEY; a later CANCEL_WAIT=11 switches to 2.1,
    // where 12 does not exist.
    p = parse_v1({{v1, request(Op::kDeleteKey, {"k"})},
                  {v1, request(Op::kWait, {"w"})},
                  {v21, request(Op::kCancelWait)},
                  {v21, request(Op::kAppend, {"k"}, {"w"})},
                  {v1, request(Op::kCancelWait)}},
                 chunk);
    ASSERT_EQ(p.requests.size(), 4u) << p.error;
    expect_same(p.requests[0], request(Op::kDeleteKey, {"k"}));
    EXPECT_EQ(p.requests[2].op, Op::kCancelWait);
    EXPECT_EQ(p.requests[3].op, Op::kAppend);
    EXPECT_EQ(p.last, Status::kError);
    EXPECT_NE(p.error.find("unknown opcode 0x0c (wire generation 1, torch 2.1 numbering)"),
              std::string::npos)
        << p.error;
    // 9, 10, 11 first: 2.1.
    for (auto& r : {request(Op::kMultiGet, {"a"}), request(Op::kMultiSet, {"a"}, {"1"}),
                    request(Op::kCancelWait)}) {
      p = parse_v1({{v21, r}, {v21, request(Op::kDeleteKey, {"a"})}}, chunk);
      ASSERT_EQ(p.requests.size(), 2u) << p.error;
      expect_same(p.requests[0], r);
      EXPECT_EQ(p.requests[1].op, Op::kDeleteKey);
      EXPECT_EQ(p.gen, v21);
    }
    // 12 (2.0-era CANCEL_WAIT) decides nothing.
    p = parse_v1({{v1, request(Op::kCancelWait)}, {v1, request(Op::kDeleteKey, {"a"})}}, chunk);
    ASSERT_EQ(p.requests.size(), 2u) << p.error;
    EXPECT_EQ(p.requests[0].op, Op::kCancelWait);
    EXPECT_EQ(p.requests[1].op, Op::kDeleteKey);
    EXPECT_EQ(p.gen, v1);
  }
  // A parser started as kV1Torch21 uses 2.1's table from the first request.
  proto::RequestParser p({}, Generation::kV1Torch21);
  const uint8_t del[] = {7, 1, 0, 0, 0, 0, 0, 0, 0, 'k'};
  size_t used = 0;
  ASSERT_EQ(p.feed(del, sizeof del, used), Status::kReady);
  EXPECT_EQ(p.take().op, Op::kDeleteKey);
}

TEST(StoreProtocol, GenerationIsDecidedLazilyFromTheFirstBytes) {
  proto::RequestParser p;
  size_t used = 0;
  EXPECT_EQ(p.feed(nullptr, 0, used), Status::kNeedMore);
  EXPECT_EQ(p.generation(), Generation::kUnknown);  // a silent connection stays undecided
  // 0x00 CE F7 85: still undecided.
  const uint8_t partial[] = {0x00, 0xCE, 0xF7, 0x85};
  EXPECT_EQ(p.feed(partial, 4, used), Status::kNeedMore);
  EXPECT_EQ(used, 4u);
  EXPECT_EQ(p.generation(), Generation::kUnknown);
  const uint8_t last[] = {0x3C};
  EXPECT_EQ(p.feed(last, 1, used), Status::kReady);
  EXPECT_EQ(p.generation(), Generation::kV2);
  EXPECT_EQ(p.take().op, Op::kValidate);
}

TEST(StoreProtocol, Gen1SetWhoseKeyLengthStartsLikeTheMagicIsGen1) {
  // A gen-1 SET (opcode 0x00) with a 0xCE-byte key: first bytes 00 CE 00 ...
  std::string key(0xCE, 'k');
  auto stream = encode(Generation::kV1, request(Op::kSet, {key}, {"v"})) +
                encode(Generation::kV1, request(Op::kGetNumKeys));
  for (size_t chunk : {size_t{1}, size_t{2}, stream.size()}) {
    auto p = parse(stream, chunk);
    ASSERT_EQ(p.last, Status::kReady) << p.error;
    EXPECT_EQ(p.gen, Generation::kV1);
    ASSERT_EQ(p.requests.size(), 2u);
    expect_same(p.requests[0], request(Op::kSet, {key}, {"v"}));
    EXPECT_EQ(p.requests[1].op, Op::kGetNumKeys);
  }
  // Key length 0xF7CE: matches two magic bytes, then differs; over the 8 KiB key limit.
  std::string big(0xF7CE, 'k');
  auto p = parse(encode(Generation::kV1, request(Op::kSet, {big}, {"v"})), 1);
  EXPECT_EQ(p.last, Status::kError);
  EXPECT_EQ(p.gen, Generation::kV1);
  EXPECT_NE(p.error.find("exceeds the limit"), std::string::npos) << p.error;
}

TEST(StoreProtocol, GetNumKeysAloneIsOneByteGen1Request) {
  const uint8_t b[] = {0x06};
  proto::RequestParser p;
  size_t used = 0;
  EXPECT_EQ(p.feed(b, 1, used), Status::kReady);
  EXPECT_EQ(p.generation(), Generation::kV1);
  EXPECT_EQ(p.take().op, Op::kGetNumKeys);
  EXPECT_TRUE(p.idle());
}

TEST(StoreProtocol, ReadyStopsAtTheEndOfARequest) {
  auto g = Generation::kV1;
  auto stream = encode(g, request(Op::kGet, {"a"})) + encode(g, request(Op::kGet, {"b"}));
  proto::RequestParser p({}, g);
  size_t used = 0;
  ASSERT_EQ(p.feed(bytes(stream), stream.size(), used), Status::kReady);
  EXPECT_EQ(used, stream.size() / 2);
  EXPECT_EQ(p.take().keys[0], "a");
  ASSERT_EQ(p.feed(bytes(stream) + used, stream.size() - used, used), Status::kReady);
  EXPECT_EQ(p.take().keys[0], "b");
}

TEST(StoreProtocol, LimitsAndGarbageAreErrors) {
  proto::Limits small;
  small.max_key_bytes = 4;
  small.max_payload_bytes = 8;
  small.max_keys_per_request = 2;
  small.max_request_bytes = 16;
  auto g = Generation::kV2;
  auto bad = [&](const std::string& stream, const char* needle) {
    auto p = parse(stream, 1, g, small);
    EXPECT_EQ(p.last, Status::kError);
    EXPECT_NE(p.error.find(needle), std::string::npos) << p.error;
  };
  bad(encode(g, request(Op::kGet, {"12345"})), "key of 5 bytes exceeds the limit of 4");
  bad(encode(g, request(Op::kSet, {"k"}, {"123456789"})), "value of 9 bytes exceeds the limit of 8");
  bad(encode(g, request(Op::kWait, {"a", "b", "c"})), "WAIT of 3 keys exceeds the limit of 2");
  bad(encode(g, request(Op::kMultiSet, {"a", "b"}, {"12345678", "12345678"})), "request of more");
  bad(std::string("\x66", 1), "unknown opcode 0x66");
  // A second VALIDATE with a wrong magic.
  bad(encode(g, request(Op::kValidate, {}, {}, 0, 0xdeadbeef)), "bad VALIDATE magic");
  // The default limits are the libuv server's.
  proto::Limits d;
  EXPECT_EQ(d.max_key_bytes, 8u << 10);
  EXPECT_EQ(d.max_payload_bytes, 8u << 20);
  EXPECT_EQ(d.max_keys_per_request, 128u << 10);
  EXPECT_EQ(d.max_request_bytes, SIZE_MAX);  // no per-request total, as in PyTorch
  // An error is sticky.
  proto::RequestParser p({}, g);
  size_t used;
  const uint8_t junk[] = {0xff, 0x01};
  EXPECT_EQ(p.feed(junk, 2, used), Status::kError);
  EXPECT_EQ(p.feed(junk + 1, 1, used), Status::kError);
}

TEST(StoreProtocol, ByteByByteIsLinear) {
  // 128 Ki keys fed one byte at a time: a parser that rescans from the request start on
  // every byte would take ~10^11 steps; an incremental one takes ~10^6.
  std::vector<std::string> keys;
  for (int i = 0; i < (128 << 10); ++i) keys.push_back(std::string("k").append(std::to_string(i)));
  auto stream = encode(Generation::kV1, request(Op::kWait, keys));
  auto t0 = std::chrono::steady_clock::now();
  auto p = parse(stream, 1, Generation::kV1);
  auto dt = std::chrono::steady_clock::now() - t0;
  ASSERT_EQ(p.requests.size(), 1u);
  EXPECT_EQ(p.requests[0].keys, keys);
  // Linear: well under a second here. A quadratic parser takes many minutes, so the bound
  // can be far from the typical value.
  EXPECT_LT(dt, ddp::test::scaled(std::chrono::seconds(30)));
  // A 8 MiB value in 1 KiB pieces.
  std::string big(8 << 20, 'x');
  auto p2 = parse(encode(Generation::kV1, request(Op::kSet, {"big"}, {big})), 1024, Generation::kV1);
  ASSERT_EQ(p2.requests.size(), 1u);
  EXPECT_EQ(p2.requests[0].values[0].size(), big.size());
}

TEST(StoreProtocol, ParseCounterFollowsStoll) {
  EXPECT_EQ(proto::parse_counter("42"), 42);
  EXPECT_EQ(proto::parse_counter("  -7"), -7);
  EXPECT_EQ(proto::parse_counter("+3abc"), 3);
  EXPECT_EQ(proto::parse_counter("9223372036854775807"), INT64_MAX);
  EXPECT_EQ(proto::parse_counter("-9223372036854775808"), INT64_MIN);
  EXPECT_FALSE(proto::parse_counter("9223372036854775808"));
  EXPECT_FALSE(proto::parse_counter(""));
  EXPECT_FALSE(proto::parse_counter("abc"));
  EXPECT_FALSE(proto::parse_counter("-"));
}
