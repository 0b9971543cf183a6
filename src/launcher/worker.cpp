#include "launcher/worker.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <sstream>

#include "launcher/gpu.hpp"
#include "launcher/output.hpp"
#include "launcher/process.hpp"

namespace ddprun {

namespace {

std::string get(const std::map<std::string, std::string>& env, const std::string& k, const std::string& def = "") {
  auto it = env.find(k);
  return it == env.end() ? def : it->second;
}

}  // namespace

WorkerCommand worker_command(const Options& o, int local_rank, const std::map<std::string, std::string>& env) {
  WorkerCommand c;
  const std::string path_env = get(env, "PATH", "/usr/local/bin:/usr/bin:/bin");
  std::vector<std::string> args;
  // torchrun's macros.substitute: each argument through string.Template.safe_substitute
  // (`$local_rank` and `${local_rank}`; `$$` is `$`).
  const std::string lr = std::to_string(local_rank);
  auto local_rank_only = [&](std::string_view name) -> std::optional<std::string> {
    return name == "local_rank" ? std::optional<std::string>(lr) : std::nullopt;
  };
  for (auto& a : o.script_args) args.push_back(safe_substitute(a, local_rank_only));
  if (runs_directly(o)) {
    c.path = find_executable(o.script, path_env);
    if (c.path.empty()) c.path = o.script;
    c.argv.push_back(o.script);
  } else {
    std::string python = get(env, "PYTHON_EXEC", "python3");
    if (python.empty()) python = "python3";
    c.path = find_executable(python, path_env);
    if (c.path.empty()) c.path = python;  // execve reports ENOENT, which ddprun explains
    c.argv = {python, "-u"};
    c.interpreter = c.path;
    if (o.module) c.argv.push_back("-m");
    c.argv.push_back(o.script);
  }
  c.argv.insert(c.argv.end(), args.begin(), args.end());
  return c;
}

bool sets_omp_threads(const Options& o, const std::map<std::string, std::string>& base) {
  return !base.count("OMP_NUM_THREADS") && o.nproc_per_node > 1;
}

std::map<std::string, std::string> node_environment(const Options& o, const std::map<std::string, std::string>& base) {
  std::map<std::string, std::string> env = base;
  env["ROLE_NAME"] = o.role;
  env["LOCAL_WORLD_SIZE"] = std::to_string(o.nproc_per_node);
  env["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(o.max_restarts);
  env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = get(base, "TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
  if (sets_omp_threads(o, base)) env["OMP_NUM_THREADS"] = "1";
  return env;
}

std::map<std::string, std::string> warm_environment(const Options& o, const std::map<std::string, std::string>& base) {
  std::map<std::string, std::string> env = node_environment(o, base);
  for (const char* k : {"LOCAL_RANK", "RANK", "GROUP_RANK", "ROLE_RANK", "WORLD_SIZE", "GROUP_WORLD_SIZE",
                        "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
                        "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE"})
    env.erase(k);
  return env;
}

std::map<std::string, std::string> worker_environment(const Options& o, const JobPlan& plan, int local_rank,
                                                      const std::string& error_file,
                                                      const std::map<std::string, std::string>& base) {
  std::map<std::string, std::string> env = node_environment(o, base);
  const int rank = plan.rank_base + local_rank;
  auto s = [](auto v) { return std::to_string(v); };
  env["LOCAL_RANK"] = s(local_rank);
  env["RANK"] = s(rank);
  env["GROUP_RANK"] = s(plan.group_rank);
  env["ROLE_RANK"] = s(rank);
  env["WORLD_SIZE"] = s(plan.world_size);
  env["GROUP_WORLD_SIZE"] = s(plan.group_world_size);
  env["ROLE_WORLD_SIZE"] = s(plan.world_size);
  env["MASTER_ADDR"] = plan.master_addr;
  env["MASTER_PORT"] = s(plan.master_port);
  env["TORCHELASTIC_RESTART_COUNT"] = s(plan.restart_count);
  env["TORCHELASTIC_RUN_ID"] = plan.run_id;
  env["TORCHELASTIC_USE_AGENT_STORE"] = plan.use_agent_store ? "True" : "False";
  env["TORCHELASTIC_ERROR_FILE"] = error_file;
  if (o.virtual_local_rank) {
    // Each worker sees only its own GPU, as device 0: its entry of CUDA_VISIBLE_DEVICES (the
    // options checked there is one for every local rank), else its local rank.
    const auto ids = visible_device_ids(base);
    const auto lr = static_cast<size_t>(local_rank);
    env["CUDA_VISIBLE_DEVICES"] = ids && lr < ids->size() ? (*ids)[lr] : s(local_rank);
    env["LOCAL_RANK"] = "0";
  }
  return env;
}

std::vector<std::string> to_envp(const std::map<std::string, std::string>& env) {
  std::vector<std::string> out;
  out.reserve(env.size());
  for (auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

}  // namespace ddprun
