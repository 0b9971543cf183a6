// libFuzzer target over the store's incremental request parser (src/store/protocol.cpp).
//
// Oracles, beyond the sanitizers:
//  - differential: the input fed whole and fed in pieces (sizes taken from the first byte)
//    must give the same requests, the same final status and the same error;
//  - round trip: every parsed request, encoded again, parses back to itself.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "store/protocol.hpp"

namespace proto = ddp::detail::proto;
using Status = proto::RequestParser::Status;

namespace {

struct Outcome {
  std::vector<proto::Request> requests;
  Status last = Status::kNeedMore;
  std::string error;
  proto::Generation gen = proto::Generation::kUnknown;
};

Outcome run(const uint8_t* data, size_t size, proto::Generation g, const proto::Limits& lim,
            size_t chunk) {
  proto::RequestParser p(lim, g);
  Outcome o;
  size_t off = 0;
  while (off < size && o.requests.size() < 4096) {
    size_t n = std::min(chunk, size - off);
    size_t used = 0;
    o.last = p.feed(data + off, n, used);
    if (used > n) __builtin_trap();
    off += used;
    if (o.last == Status::kReady) {
      o.requests.push_back(p.take());
    } else if (o.last == Status::kError) {
      o.error = p.error();
      break;
    } else if (used != n) {
      __builtin_trap();  // kNeedMore must consume everything it was given
    }
  }
  o.gen = p.generation();
  return o;
}

bool same(const proto::Request& a, const proto::Request& b) {
  return a.op == b.op && a.keys == b.keys && a.values == b.values && a.i64 == b.i64 &&
         a.u32 == b.u32;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  ++data;
  --size;
  const auto g = static_cast<proto::Generation>(mode % 3);  // unknown, 1, 2
  proto::Limits lim;
  if (mode & 0x80) {  // small limits, so that the fuzzer reaches them
    lim.max_key_bytes = 16;
    lim.max_payload_bytes = 64;
    lim.max_keys_per_request = 8;
    lim.max_request_bytes = 256;
  }
  const size_t chunk = 1 + ((mode >> 2) & 0x0f);

  Outcome whole = run(data, size, g, lim, size);
  Outcome split = run(data, size, g, lim, chunk);
  if (whole.requests.size() != split.requests.size()) __builtin_trap();
  for (size_t i = 0; i < whole.requests.size(); ++i)
    if (!same(whole.requests[i], split.requests[i])) __builtin_trap();
  if (whole.last != split.last || whole.error != split.error || whole.gen != split.gen)
    __builtin_trap();

  for (auto& r : whole.requests) {
    std::string bytes;
    proto::encode_request(whole.gen, r, bytes);
    proto::RequestParser p(lim, whole.gen);
    size_t used = 0;
    auto st = p.feed(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), used);
    if (st != Status::kReady || used != bytes.size()) __builtin_trap();
    if (!same(p.take(), r)) __builtin_trap();
  }
  return 0;
}
