// Data-parallel SGD of a linear model y = w.x + b on synthetic data sharded by rank.
// Each step every rank computes the gradient of the mean squared error on its shard; the
// gradients (and the loss) are averaged with one all_reduce; every rank applies the same
// update. Rank 0 prints the loss, which falls to ~0, and writes the model; at the end every
// rank checks that its weights are bitwise equal to rank 0's.
//
//   build/bin/ddprun --standalone --nproc-per-node 4 build/bin/train_linear
//   build/bin/train_linear --spawn 4           (no launcher: forks 4 local ranks)
//   options: --steps N --lr X --dim D --samples N --print-every N --out PATH
//            --backend cpu|nccl
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <ddp/ddp.hpp>

#include "spawn.hpp"

namespace {

struct Args {
  int steps = 300;
  float lr = 0.02f;
  int dim = 8;
  int samples = 256;  // per rank
  int print_every = 50;
  std::string out = "linear_model.txt";
  ddp::Backend backend = ddp::Backend::kCpu;
  int spawn = 0;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw ddp::UsageError("train_linear: " + k + " needs a value");
      return argv[++i];
    };
    // A whole number (or, for --lr, any number) at least `least`, or a usage error naming it.
    auto number = [&](int least) {
      const std::string v = value();
      char* end = nullptr;
      const double x = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(x >= least) || x > 1e9 || (k != "--lr" && x != static_cast<int>(x)))
        throw ddp::UsageError("train_linear: " + k + " needs " + (k == "--lr" ? "a number" : "a whole number") +
                              " of at least " + std::to_string(least) + ", not '" + v + "'");
      return x;
    };
    if (k == "--steps") a.steps = static_cast<int>(number(0));
    else if (k == "--lr") a.lr = static_cast<float>(number(0));
    else if (k == "--dim") a.dim = static_cast<int>(number(1));
    else if (k == "--samples") a.samples = static_cast<int>(number(1));
    else if (k == "--print-every") a.print_every = static_cast<int>(number(1));
    else if (k == "--out") a.out = value();
    else if (k == "--spawn") a.spawn = static_cast<int>(number(0));
    else if (k == "--backend") {
      std::string b = value();
      if (b == "cpu") a.backend = ddp::Backend::kCpu;
      else if (b == "nccl") a.backend = ddp::Backend::kNccl;
      else throw ddp::UsageError("train_linear: --backend must be cpu or nccl, not " + b);
    } else if (k == "-h" || k == "--help") {
      std::puts("usage: train_linear [--steps N] [--lr X] [--dim D] [--samples N] [--print-every N]"
                " [--out PATH] [--backend cpu|nccl] [--spawn N]");
      std::exit(0);
    } else {
      throw ddp::UsageError("train_linear: unknown argument " + k);
    }
  }
  return a;
}

// All-reduce (avg) a host vector of floats on the group's backend.
class Reducer {
 public:
  Reducer(ddp::ProcessGroup& pg, size_t n) : pg_(pg) {
    if (pg.backend() == ddp::Backend::kNccl) dev_.emplace(n * sizeof(float), device(pg.rank()));
  }
  void avg(std::vector<float>& v) { run(v, [&](void* p) { pg_.all_reduce(p, v.size(), ddp::DType::kFloat32, {.op = ddp::ReduceOp::kAvg}); }); }
  void bcast(std::vector<float>& v) { run(v, [&](void* p) { pg_.broadcast(p, v.size(), ddp::DType::kFloat32, {.root = 0}); }); }

 private:
  // The NCCL group's default device: LOCAL_RANK (here: the rank when unset) modulo devices.
  static int device(int rank) {
    const char* lr = std::getenv("LOCAL_RANK");
    int n = ddp::cuda_device_count();
    return n > 0 ? (lr ? std::atoi(lr) : rank) % n : 0;
  }
  template <class F>
  void run(std::vector<float>& v, F&& f) {
    if (!dev_) return f(v.data());
    dev_->copy_from_host(v.data(), v.size() * sizeof(float));
    f(dev_->data());
    dev_->copy_to_host(v.data(), v.size() * sizeof(float));
  }
  ddp::ProcessGroup& pg_;
  std::optional<ddp::DeviceBuffer> dev_;
};

int train(const Args& a, ddp::ProcessGroup& pg) {
  const int d = a.dim, m = a.samples, r = pg.rank();
  // Ground truth shared by all ranks; features differ per rank (the shard).
  std::vector<float> w_true(d);
  for (int j = 0; j < d; ++j) w_true[j] = 0.5f * static_cast<float>(j + 1) * (j % 2 ? -1.0f : 1.0f);
  const float b_true = 0.3f;
  std::mt19937 rng(1234u + static_cast<unsigned>(r));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m) * d), y(m);
  for (int i = 0; i < m; ++i) {
    float t = b_true;
    for (int j = 0; j < d; ++j) t += w_true[j] * (x[i * d + j] = normal(rng));
    y[i] = t;
  }

  std::vector<float> w(d + 1, 0.0f);  // weights, then bias
  std::vector<float> g(d + 2);        // gradient, then the loss
  Reducer reduce(pg, g.size());
  float loss = 0;
  for (int step = 1; step <= a.steps; ++step) {
    std::fill(g.begin(), g.end(), 0.0f);
    for (int i = 0; i < m; ++i) {
      float pred = w[d];
      for (int j = 0; j < d; ++j) pred += w[j] * x[i * d + j];
      float err = pred - y[i];
      for (int j = 0; j < d; ++j) g[j] += 2.0f * err * x[i * d + j] / static_cast<float>(m);
      g[d] += 2.0f * err / static_cast<float>(m);
      g[d + 1] += err * err / static_cast<float>(m);
    }
    reduce.avg(g);
    loss = g[d + 1];
    for (int j = 0; j <= d; ++j) w[j] -= a.lr * g[j];
    if (r == 0 && (step % a.print_every == 0 || step == 1))
      std::printf("step %5d  loss %.3e\n", step, static_cast<double>(loss));
  }

  std::vector<float> w0 = w;
  reduce.bcast(w0);
  if (std::memcmp(w0.data(), w.data(), w.size() * sizeof(float)) != 0)
    throw ddp::CollectiveError("rank " + std::to_string(r) + ": weights differ from rank 0's");
  if (r == 0) {
    std::ofstream f(a.out);
    for (int j = 0; j < d; ++j) f << "w" << j << " " << w[j] << "\n";
    f << "b " << w[d] << "\n";
    if (!f) throw ddp::Error("cannot write the model to " + a.out);
    std::printf("final loss %.3e over %d ranks; weights identical on all ranks; model -> %s\n",
                static_cast<double>(loss), pg.size(), a.out.c_str());
  }
  if (!(loss < 1e-4f))
    throw ddp::CollectiveError("training did not converge: final loss " + std::to_string(loss));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return ddp::run_main([&] {
    Args a = parse(argc, argv);
    ddp::ProcessGroupOptions o;
    o.backend = a.backend;
    o.timeout = std::chrono::seconds(120);
    return ddp_testing::with_process_group(a.spawn, o, [&](ddp::ProcessGroup& pg) { return train(a, pg); });
  });
}
