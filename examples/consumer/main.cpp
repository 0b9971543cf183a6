// Minimal worker: joins from ddprun's environment (RANK/WORLD_SIZE/...), or with
// --memory-store as a single rank over an explicit in-memory store, then all-reduces.
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include <ddp/ddp.hpp>

int main(int argc, char** argv) {
  return ddp::run_main([&] {
    std::unique_ptr<ddp::ProcessGroup> pg;
    if (argc > 1 && std::strcmp(argv[1], "--memory-store") == 0) {
      ddp::ProcessGroupOptions o;
      o.rank = 0;
      o.world_size = 1;
      o.store = std::make_shared<ddp::MemoryStore>();
      pg = ddp::init_process_group(o);
    } else {
      pg = ddp::init_process_group_from_env();
    }
    std::vector<float> v(8, static_cast<float>(pg->rank() + 1));
    pg->all_reduce(std::span<float>(v));
    const float want = static_cast<float>(pg->size() * (pg->size() + 1) / 2);
    if (v[0] != want) throw ddp::CollectiveError("unexpected all_reduce result");
    pg->barrier();
    if (pg->rank() == 0) std::printf("consumer: world %d all_reduce ok (%g)\n", pg->size(), v[0]);
    return 0;
  });
}
