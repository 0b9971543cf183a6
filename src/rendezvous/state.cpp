#include "rendezvous/state.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ddp/error.hpp"

namespace ddprun::rdzv {

using nlohmann::json;

namespace {

constexpr std::string_view kMagic = "ddprun-rdzv ";

json node_json(const NodeDesc& n) {
  return {{"id", n.id}, {"addr", n.addr}, {"host", n.host}, {"master", n.master_addr}, {"nproc", n.nproc}};
}

NodeDesc node_from(const json& j) {
  NodeDesc n;
  n.id = j.at("id").get<std::string>();
  n.addr = j.at("addr").get<std::string>();
  n.host = j.value("host", "");
  n.master_addr = j.value("master", "");
  n.nproc = j.at("nproc").get<int>();
  return n;
}

json list_json(const std::vector<NodeDesc>& list) {
  json a = json::array();
  for (auto& n : list) a.push_back(node_json(n));
  return a;
}

std::vector<NodeDesc> list_from(const json& j, const char* key) {
  std::vector<NodeDesc> out;
  if (!j.contains(key)) return out;
  for (auto& n : j.at(key)) out.push_back(node_from(n));
  return out;
}

// torchrun's state: base64 of a pickle (protocol 2..5), or its "no state yet" sentinel.
bool looks_like_torchrun(const std::string& v) {
  return v == "Y2FuaW1hZGFt" || v.starts_with("gASV") || v.starts_with("gAWV") || v.starts_with("gAJ") ||
         v.starts_with("gAN");
}

}  // namespace

std::string NodeDesc::describe() const {
  if (host.empty() || host == addr) return fmt::format("{} ({})", addr, id);
  return fmt::format("{} ({}, {})", host, addr, id);
}

int State::rank_of(const std::string& id) const {
  for (size_t i = 0; i < participants.size(); ++i)
    if (participants[i].id == id) return static_cast<int>(i);
  return -1;
}

bool State::contains(const std::vector<NodeDesc>& list, const std::string& id) {
  for (auto& n : list)
    if (n.id == id) return true;
  return false;
}

std::string encode_state(const State& s) {
  json j = {{"seq", s.seq},
            {"round", s.round},
            {"complete", s.complete},
            {"last_call", s.last_call},
            {"closed", s.closed},
            {"closed_reason", s.closed_reason},
            {"restarts", s.restarts},
            {"participants", list_json(s.participants)},
            {"wait_list", list_json(s.wait_list)},
            {"redundancy_list", list_json(s.redundancy_list)},
            {"ending_round", s.ending_round},
            {"ending_counted", s.ending_counted},
            {"requests_seen", s.requests_seen}};
  if (s.job)
    j["job"] = {{"min_nodes", s.job->min_nodes}, {"max_nodes", s.job->max_nodes},
                {"max_restarts", s.job->max_restarts}};
  return fmt::format("{}{}\n{}", kMagic, State::kFormat, j.dump());
}

State decode_state(const std::string& value, const std::string& where) {
  if (looks_like_torchrun(value))
    throw ddp::Error(fmt::format(
        "rendezvous: {} holds a torchrun agent's rendezvous state for this --rdzv-id (a pickled "
        "torch.distributed.elastic state): ddprun and torchrun cannot share a rendezvous; launch every node "
        "with ddprun, or give this job another --rdzv-id",
        where));
  if (!value.starts_with(kMagic))
    throw ddp::Error(fmt::format("rendezvous: {} holds a value for this --rdzv-id that is not a rendezvous state "
                                 "('{}...'); give this job another --rdzv-id",
                                 where, value.substr(0, 16)));
  auto nl = value.find('\n');
  int format = 0;
  try {
    format = std::stoi(value.substr(kMagic.size(), nl - kMagic.size()));
  } catch (const std::exception&) {
  }
  if (format != State::kFormat)
    throw ddp::Error(fmt::format("rendezvous: {} holds a rendezvous state of format {} (this ddprun reads format {}): "
                                 "every node of a job must run the same ddprun version",
                                 where, value.substr(kMagic.size(), nl - kMagic.size()), State::kFormat));
  try {
    json j = json::parse(value.substr(nl + 1));
    State s;
    s.seq = j.at("seq").get<int64_t>();
    s.round = j.at("round").get<int64_t>();
    s.complete = j.at("complete").get<bool>();
    s.last_call = j.at("last_call").get<bool>();
    s.closed = j.at("closed").get<bool>();
    s.closed_reason = j.value("closed_reason", "");
    s.restarts = j.at("restarts").get<int>();
    s.participants = list_from(j, "participants");
    s.wait_list = list_from(j, "wait_list");
    s.redundancy_list = list_from(j, "redundancy_list");
    s.ending_round = j.value("ending_round", int64_t{-1});
    s.ending_counted = j.value("ending_counted", false);
    s.requests_seen = j.value("requests_seen", int64_t{0});
    if (j.contains("job")) {
      auto& jj = j.at("job");
      s.job = JobSettings{jj.at("min_nodes").get<int>(), jj.at("max_nodes").get<int>(),
                          jj.at("max_restarts").get<int>()};
    }
    return s;
  } catch (const json::exception& e) {
    throw ddp::Error(fmt::format("rendezvous: the state in {} is corrupt: {}", where, e.what()));
  }
}

}  // namespace ddprun::rdzv
