// The min kernel before and after NaN propagation (libddp, src/collectives/reduce.cpp), on
// 64 MiB of floats in place, best of 15 each, three rounds; built by hand, not by CMake:
//   g++ -std=c++20 -O3 bench/ddp-bench/minmax_kernel.cpp -o /tmp/minmax_kernel && /tmp/minmax_kernel
#include <chrono>
#include <cstdio>
#include <vector>
#include <algorithm>
template <class T> struct MinOld { T operator()(T a, T b) const { return b < a ? b : a; } };
template <class T> struct MinNew { T operator()(T a, T b) const { return (b < a || b != b) ? b : a; } };
template <class T, class F>
__attribute__((noinline)) void loop_inplace(T* __restrict d, const T* __restrict s, size_t n) { F f; for (size_t i = 0; i < n; ++i) d[i] = f(d[i], s[i]); }
template <class F> double run(std::vector<float>& d, const std::vector<float>& s) {
  double best = 1e9;
  for (int r = 0; r < 15; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    loop_inplace<float, F>(d.data(), s.data(), d.size());
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}
int main() {
  size_t n = 16u << 20;  // 64 MiB of floats
  std::vector<float> d(n), s(n);
  for (size_t i = 0; i < n; ++i) { d[i] = float(i % 97); s[i] = float(i % 89); }
  for (int k = 0; k < 3; ++k) {
    double o = run<MinOld<float>>(d, s), w = run<MinNew<float>>(d, s);
    std::printf("old %.2f ms (%.1f GB/s)  new %.2f ms (%.1f GB/s)  new/old %.2f\n", o * 1e3, 3 * n * 4 / o / 1e9, w * 1e3, 3 * n * 4 / w / 1e9, w / o);
  }
}
