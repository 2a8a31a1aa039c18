// The C++ floor of the per-op benchmark: a 1-element tensor add issued from
// C++ against LibTorch directly. Prints seconds per op (best of 5 runs).
//   anatomy_bench_add [ops]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  long n = argc > 1 ? std::atol(argv[1]) : 200000;
  at::set_num_threads(1);
  at::Tensor a = at::ones({1}), b = at::full({1}, 2.0);
  double best = 1e9;
  for (int run = 0; run < 5; ++run) {
    auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < n; ++i) {
      at::Tensor c = at::add(a, b);
      (void)c;
    }
    std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    best = std::min(best, dt.count() / n);
  }
  std::printf("{\"median\": %.9g, \"n\": %ld}\n", best, n);
  return 0;
}
