// A minimal fork-join loop over independent items. Each item is processed by exactly one
// thread, so results never depend on scheduling.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "common/env.h"

namespace mok::cpu {

// Threads to use: JAX_MOK_CPU_THREADS if set (common/env.h; a bad value is an error of the
// handlers before they get here), else the machine's hardware threads, at most 64.
inline int NumThreads() {
  if (const int n = env::Get().cpu_threads; n > 0) return n;
  unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(std::min(hw, 64u));
}

// Calls fn(item, worker) for item in [0, n); worker in [0, workers) indexes per-thread scratch.
template <typename Fn>
void ParallelFor(int64_t n, int workers, Fn&& fn) {
  workers = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(workers, n)));
  if (workers == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  std::atomic<int64_t> next{0};
  auto run = [&](int worker) {
    for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i, worker);
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(workers - 1));
  for (int w = 1; w < workers; ++w) threads.emplace_back(run, w);
  run(0);
  for (auto& t : threads) t.join();
}

}  // namespace mok::cpu
