#include "store/protocol.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace ddp::detail::proto {

namespace {

// Wire opcode -> operation, per generation (protocol.hpp lists them).
constexpr Op kV1Ops[] = {Op::kSet,       Op::kCompareSet, Op::kGet,      Op::kAdd,
                         Op::kCheck,     Op::kWait,       Op::kGetNumKeys, Op::kWatchKey,
                         Op::kDeleteKey, Op::kAppend,     Op::kMultiGet, Op::kMultiSet,
                         Op::kCancelWait};
constexpr Op kV1Torch21Ops[] = {Op::kSet,        Op::kCompareSet, Op::kGet,
                                Op::kAdd,        Op::kCheck,      Op::kWait,
                                Op::kGetNumKeys, Op::kDeleteKey,  Op::kAppend,
                                Op::kMultiGet,   Op::kMultiSet,   Op::kCancelWait};
constexpr Op kV2Ops[] = {Op::kValidate,  Op::kSet,       Op::kCompareSet, Op::kGet,
                         Op::kAdd,       Op::kCheck,     Op::kWait,       Op::kGetNumKeys,
                         Op::kDeleteKey, Op::kAppend,    Op::kMultiGet,   Op::kMultiSet,
                         Op::kCancelWait, Op::kPing,     Op::kQueuePush,  Op::kQueuePop,
                         Op::kQueueLen,  Op::kList,      Op::kBarrier};
constexpr Op kV2Extensions[] = {Op::kLease,   Op::kOnLeaseEnd, Op::kWaitGrows,
                                Op::kGetFrom, Op::kTrimLog,    Op::kLogFrom};

// Generation-1 opcodes whose meaning differs between torch <= 2.0 and torch 2.1.
constexpr uint8_t kV1WatchOrDelete = 7;  // 1.13 WATCH_KEY, 2.1 DELETE_KEY
constexpr uint8_t kV1DeleteOrAppend = 8;  // 1.13 DELETE_KEY, 2.1 APPEND
constexpr uint8_t kV1CancelWait20 = 12;  // CANCEL_WAIT of a 2.0-era main; not in 2.1

std::string hex_byte(uint8_t b) {
  static const char* digits = "0123456789abcdef";
  std::string s = "0x";
  s += digits[b >> 4];
  s += digits[b & 15];
  return s;
}

const char* gen_name(Generation g) {
  switch (g) {
    case Generation::kV1: return "1";
    case Generation::kV2: return "2";
    case Generation::kV1Torch21: return "1, torch 2.1 numbering";
    default: return "?";
  }
}

}  // namespace

const char* op_name(Op op) {
  switch (op) {
    case Op::kValidate: return "VALIDATE";
    case Op::kPing: return "PING";
    case Op::kSet: return "SET";
    case Op::kCompareSet: return "COMPARE_SET";
    case Op::kGet: return "GET";
    case Op::kAdd: return "ADD";
    case Op::kCheck: return "CHECK";
    case Op::kWait: return "WAIT";
    case Op::kGetNumKeys: return "GETNUMKEYS";
    case Op::kWatchKey: return "WATCH_KEY";
    case Op::kDeleteKey: return "DELETE_KEY";
    case Op::kAppend: return "APPEND";
    case Op::kMultiGet: return "MULTI_GET";
    case Op::kMultiSet: return "MULTI_SET";
    case Op::kCancelWait: return "CANCEL_WAIT";
    case Op::kQueuePush: return "QUEUE_PUSH";
    case Op::kQueuePop: return "QUEUE_POP";
    case Op::kQueueLen: return "QUEUE_LEN";
    case Op::kList: return "LIST";  // LIST_KEYS in torch
    case Op::kBarrier: return "BARRIER";
    case Op::kLease: return "LEASE";
    case Op::kOnLeaseEnd: return "ON_LEASE_END";
    case Op::kWaitGrows: return "WAIT_GROWS";
    case Op::kGetFrom: return "GET_FROM";
    case Op::kTrimLog: return "TRIM_LOG";
    case Op::kLogFrom: return "LOG_FROM";
  }
  return "?";
}

std::optional<Op> decode_opcode(Generation g, uint8_t opcode) {
  if (g == Generation::kV1 && opcode < std::size(kV1Ops)) return kV1Ops[opcode];
  if (g == Generation::kV1Torch21 && opcode < std::size(kV1Torch21Ops))
    return kV1Torch21Ops[opcode];
  if (g == Generation::kV2 && opcode < std::size(kV2Ops)) return kV2Ops[opcode];
  if (g == Generation::kV2 && opcode >= kExtensionBase &&
      static_cast<size_t>(opcode - kExtensionBase) < std::size(kV2Extensions))
    return kV2Extensions[opcode - kExtensionBase];
  return std::nullopt;
}

std::optional<uint8_t> encode_opcode(Generation g, Op op) {
  auto find = [op](const Op* table, size_t n) -> std::optional<uint8_t> {
    for (size_t i = 0; i < n; ++i)
      if (table[i] == op) return static_cast<uint8_t>(i);
    return std::nullopt;
  };
  if (g == Generation::kV1) return find(kV1Ops, std::size(kV1Ops));
  if (g == Generation::kV1Torch21) return find(kV1Torch21Ops, std::size(kV1Torch21Ops));
  if (g == Generation::kV2) {
    if (auto code = find(kV2Ops, std::size(kV2Ops))) return code;
    if (auto ext = find(kV2Extensions, std::size(kV2Extensions)))
      return static_cast<uint8_t>(kExtensionBase + *ext);
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------
// RequestParser

RequestParser::RequestParser(Limits limits, Generation generation)
    : limits_(limits),
      gen_(generation),
      stage_(generation == Generation::kUnknown ? Stage::kDetect : Stage::kOpcode) {}

RequestParser::Status RequestParser::fail(std::string why) {
  stage_ = Stage::kError;
  error_ = std::move(why);
  return Status::kError;
}

std::optional<Op> RequestParser::decode(uint8_t opcode) {
  if (gen_ != Generation::kV1) return decode_opcode(gen_, opcode);
  const bool first = !v1_started_;
  v1_started_ = true;
  if (v1_callback_) {  // torch 1.13's callback connection: 1.13's opcodes only
    if (opcode <= kV1DeleteOrAppend || opcode == kV1CancelWait20) return kV1Ops[opcode];
    return std::nullopt;
  }
  if (opcode == kV1WatchOrDelete && first) {
    v1_callback_ = true;
    return Op::kWatchKey;
  }
  if (opcode == kV1WatchOrDelete || (opcode > kV1DeleteOrAppend && opcode < kV1CancelWait20)) {
    gen_ = Generation::kV1Torch21;  // evidence of torch 2.1's numbering
    return kV1Torch21Ops[opcode];
  }
  return decode_opcode(gen_, opcode);  // the same in both, or 8 (DELETE_KEY) and 12
}

bool RequestParser::begin_op(uint8_t opcode) {
  static constexpr Field kU32[] = {Field::kU32};
  static constexpr Field kKey[] = {Field::kKey};
  static constexpr Field kKeyValue[] = {Field::kKey, Field::kValue};
  static constexpr Field kKeyValue2[] = {Field::kKey, Field::kValue, Field::kValue};
  static constexpr Field kKeyI64[] = {Field::kKey, Field::kI64};
  static constexpr Field kCount[] = {Field::kCount};
  static constexpr Field kI64[] = {Field::kI64};

  auto op = decode(opcode);
  if (!op) {
    fail("unknown opcode " + hex_byte(opcode) + " (wire generation " + gen_name(gen_) + ")");
    return false;
  }
  req_ = Request{};
  req_.op = *op;
  req_bytes_ = 0;
  fields_ = nullptr;
  nfields_ = 0;
  group_ = nullptr;
  ngroup_ = 0;
  field_idx_ = group_idx_ = 0;
  in_group_ = false;
  groups_left_ = 0;
  auto schema = [&](const Field* f, size_t n, const Field* g = nullptr, size_t ng = 0) {
    fields_ = f;
    nfields_ = static_cast<uint8_t>(n);
    group_ = g;
    ngroup_ = static_cast<uint8_t>(ng);
  };
  switch (*op) {
    case Op::kValidate:
    case Op::kPing: schema(kU32, 1); break;
    case Op::kSet:
    case Op::kAppend:
    case Op::kOnLeaseEnd:
    case Op::kQueuePush: schema(kKeyValue, 2); break;
    case Op::kLease: schema(kI64, 1); break;
    case Op::kCompareSet: schema(kKeyValue2, 3); break;
    case Op::kGet:
    case Op::kDeleteKey:
    case Op::kWatchKey:
    case Op::kQueuePop:
    case Op::kQueueLen: schema(kKey, 1); break;
    case Op::kAdd:
    case Op::kWaitGrows:
    case Op::kGetFrom:
    case Op::kTrimLog:
    case Op::kLogFrom:
    case Op::kBarrier: schema(kKeyI64, 2); break;
    case Op::kCheck:
    case Op::kWait:
    case Op::kMultiGet: schema(kCount, 1, kKey, 1); break;
    case Op::kMultiSet: schema(kCount, 1, kKeyValue, 2); break;
    case Op::kGetNumKeys:
    case Op::kCancelWait:
    case Op::kList: break;
  }
  return next_field();
}

bool RequestParser::next_field() {
  for (;;) {
    if (!in_group_) {
      if (field_idx_ < nfields_) {
        cur_ = fields_[field_idx_++];
        break;
      }
      if (ngroup_ > 0 && groups_left_ > 0) {
        in_group_ = true;
        group_idx_ = 0;
        continue;
      }
    } else {
      if (group_idx_ < ngroup_) {
        cur_ = group_[group_idx_++];
        break;
      }
      if (--groups_left_ > 0) {
        group_idx_ = 0;
        continue;
      }
    }
    stage_ = Stage::kReady;
    return true;
  }
  stage_ = Stage::kFixed;
  fixed_have_ = 0;
  fixed_need_ = cur_ == Field::kU32 ? 4 : 8;
  return true;
}

bool RequestParser::on_fixed_complete() {
  switch (cur_) {
    case Field::kU32: {
      uint32_t v;
      std::memcpy(&v, fixed_, 4);
      req_.u32 = v;
      if (req_.op == Op::kValidate && v != kValidationMagic) {
        fail("bad VALIDATE magic " + std::to_string(v));
        return false;
      }
      return next_field();
    }
    case Field::kI64: {
      std::memcpy(&req_.i64, fixed_, 8);
      return next_field();
    }
    case Field::kCount: {
      uint64_t n;
      std::memcpy(&n, fixed_, 8);
      if (n > limits_.max_keys_per_request) {
        fail(std::string(op_name(req_.op)) + " of " + std::to_string(n) +
             " keys exceeds the limit of " + std::to_string(limits_.max_keys_per_request));
        return false;
      }
      groups_left_ = n;
      size_t hint = static_cast<size_t>(std::min<uint64_t>(n, 1024));
      req_.keys.reserve(hint);
      if (ngroup_ > 1) req_.values.reserve(hint);
      return next_field();
    }
    case Field::kKey:
    case Field::kValue: {
      uint64_t len;
      std::memcpy(&len, fixed_, 8);
      bool key = cur_ == Field::kKey;
      size_t limit = key ? limits_.max_key_bytes : limits_.max_payload_bytes;
      if (len > limit) {
        fail(std::string(op_name(req_.op)) + ": " + (key ? "key" : "value") + " of " +
             std::to_string(len) + " bytes exceeds the limit of " + std::to_string(limit));
        return false;
      }
      req_bytes_ += len;
      if (req_bytes_ > limits_.max_request_bytes) {
        fail(std::string(op_name(req_.op)) + ": request of more than " +
             std::to_string(limits_.max_request_bytes) + " bytes");
        return false;
      }
      auto& vec = key ? req_.keys : req_.values;
      vec.emplace_back();
      str_ = &vec.back();
      // Reserve modestly: a declared length is only a promise; growth is amortised.
      str_->reserve(static_cast<size_t>(std::min<uint64_t>(len, 64 << 10)));
      if (len == 0) return next_field();
      str_left_ = len;
      stage_ = Stage::kStrBody;
      return true;
    }
  }
  return false;
}

RequestParser::Status RequestParser::feed_detect(const uint8_t* data, size_t size,
                                                 size_t& consumed) {
  static constexpr uint8_t kMagic[4] = {0xCE, 0xF7, 0x85, 0x3C};
  static_assert(kValidationMagic == 0x3C85F7CE);
  while (consumed < size) {
    uint8_t b = data[consumed];
    if (detect_len_ == 0) {
      if (b != 0) {  // not VALIDATE: generation 1
        gen_ = Generation::kV1;
        stage_ = Stage::kOpcode;
        return Status::kNeedMore;
      }
      detect_[detect_len_++] = b;
      ++consumed;
      continue;
    }
    if (b == kMagic[detect_len_ - 1]) {
      detect_[detect_len_++] = b;
      ++consumed;
      if (detect_len_ == 5) {
        gen_ = Generation::kV2;
        req_ = Request{};
        req_.op = Op::kValidate;
        req_.u32 = kValidationMagic;
        stage_ = Stage::kReady;
        return Status::kReady;
      }
      continue;
    }
    // A generation-1 SET (opcode 0x00) whose key length merely began like the magic:
    // replay what was held back; a SET needs at least 17 bytes, so it cannot complete here.
    gen_ = Generation::kV1;
    stage_ = Stage::kOpcode;
    size_t used = 0;
    uint8_t held[5];
    std::memcpy(held, detect_, detect_len_);
    Status st = feed(held, detect_len_, used);
    if (st == Status::kError) return st;
    return Status::kNeedMore;
  }
  return Status::kNeedMore;
}

RequestParser::Status RequestParser::feed(const uint8_t* data, size_t size, size_t& consumed) {
  consumed = 0;
  if (stage_ == Stage::kDetect) {
    Status st = feed_detect(data, size, consumed);
    if (st != Status::kNeedMore || stage_ == Stage::kDetect) return st;
  }
  for (;;) {
    switch (stage_) {
      case Stage::kError: return Status::kError;
      case Stage::kReady: return Status::kReady;
      case Stage::kDetect: return Status::kNeedMore;  // unreachable
      case Stage::kOpcode:
        if (consumed == size) return Status::kNeedMore;
        if (!begin_op(data[consumed++])) return Status::kError;
        break;
      case Stage::kFixed: {
        size_t n = std::min<size_t>(fixed_need_ - fixed_have_, size - consumed);
        std::memcpy(fixed_ + fixed_have_, data + consumed, n);
        fixed_have_ = static_cast<uint8_t>(fixed_have_ + n);
        consumed += n;
        if (fixed_have_ < fixed_need_) return Status::kNeedMore;
        if (!on_fixed_complete()) return Status::kError;
        break;
      }
      case Stage::kStrBody: {
        if (consumed == size) return Status::kNeedMore;
        size_t n = static_cast<size_t>(std::min<uint64_t>(str_left_, size - consumed));
        str_->append(reinterpret_cast<const char*>(data + consumed), n);
        str_left_ -= n;
        consumed += n;
        if (str_left_ == 0 && !next_field()) return Status::kError;
        break;
      }
    }
  }
}

Request RequestParser::take() {
  Request r = std::move(req_);
  req_ = Request{};
  if (stage_ == Stage::kReady) stage_ = Stage::kOpcode;
  return r;
}

// ---------------------------------------------------------------------------------------
// Encoders

void put_u8(std::string& out, uint8_t v) { out.push_back(static_cast<char>(v)); }
void put_u32(std::string& out, uint32_t v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}
void put_u64(std::string& out, uint64_t v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}
void put_i64(std::string& out, int64_t v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}
void put_str(std::string& out, std::string_view s) {
  put_u64(out, s.size());
  out.append(s.data(), s.size());
}

void encode_request(Generation g, const Request& r, std::string& out) {
  auto code = encode_opcode(g, r.op);
  if (!code)
    throw std::invalid_argument(std::string(op_name(r.op)) + " does not exist in wire generation " +
                                gen_name(g));
  auto need = [&](size_t keys, size_t values) {
    if (r.keys.size() < keys || r.values.size() < values)
      throw std::invalid_argument(std::string(op_name(r.op)) + ": missing request fields");
  };
  put_u8(out, *code);
  switch (r.op) {
    case Op::kValidate:
    case Op::kPing: put_u32(out, r.u32); break;
    case Op::kLease: put_i64(out, r.i64); break;
    case Op::kSet:
    case Op::kAppend:
    case Op::kOnLeaseEnd:
    case Op::kQueuePush:
      need(1, 1);
      put_str(out, r.keys[0]);
      put_str(out, r.values[0]);
      break;
    case Op::kCompareSet:
      need(1, 2);
      put_str(out, r.keys[0]);
      put_str(out, r.values[0]);
      put_str(out, r.values[1]);
      break;
    case Op::kGet:
    case Op::kDeleteKey:
    case Op::kWatchKey:
    case Op::kQueuePop:
    case Op::kQueueLen:
      need(1, 0);
      put_str(out, r.keys[0]);
      break;
    case Op::kAdd:
    case Op::kWaitGrows:
    case Op::kGetFrom:
    case Op::kTrimLog:
    case Op::kLogFrom:
    case Op::kBarrier:
      need(1, 0);
      put_str(out, r.keys[0]);
      put_i64(out, r.i64);
      break;
    case Op::kCheck:
    case Op::kWait:
    case Op::kMultiGet:
      put_u64(out, r.keys.size());
      for (auto& k : r.keys) put_str(out, k);
      break;
    case Op::kMultiSet:
      need(r.keys.size(), r.keys.size());
      put_u64(out, r.keys.size());
      for (size_t i = 0; i < r.keys.size(); ++i) {
        put_str(out, r.keys[i]);
        put_str(out, r.values[i]);
      }
      break;
    case Op::kGetNumKeys:
    case Op::kCancelWait:
    case Op::kList: break;
  }
}

std::optional<int64_t> parse_counter(std::string_view text) {
  size_t i = 0;
  while (i < text.size() && (text[i] == ' ' || (text[i] >= '\t' && text[i] <= '\r'))) ++i;
  bool neg = false;
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) neg = text[i++] == '-';
  size_t start = i;
  // Accumulate as a negative number so that INT64_MIN fits.
  int64_t v = 0;
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
    int d = text[i] - '0';
    if (v < (kMin + d) / 10) return std::nullopt;
    v = v * 10 - d;
  }
  if (i == start) return std::nullopt;
  if (!neg) {
    if (v == kMin) return std::nullopt;
    v = -v;
  }
  return v;
}

}  // namespace ddp::detail::proto
