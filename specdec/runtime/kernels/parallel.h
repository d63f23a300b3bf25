// How finely the kernels split a loop over threads: by work, so that a chunk is worth waking a
// thread for. A one-token pass of a small model is hundreds of short loops; split item by item, its
// threads spend longer meeting at the ends of the loops than working, most of all on a busy machine
// (a thread that is not running holds up the others at every end). The split never changes a
// result: a chunk is whole items (output tiles, rows, attention heads), each computed alone.
#pragma once
#include <algorithm>
#include <cstdint>

namespace specdec {

// Units of work (weight bytes streamed, or multiply-adds) that a chunk holds at least: some
// microseconds of one core's work.
constexpr int64_t kMinChunkWork = int64_t{1} << 17;

// The grain for `at::parallel_for` over items of `work_per_item` units each (at least `at_least`).
inline int64_t grain_for(int64_t work_per_item, int64_t at_least = 1) {
  const int64_t per_item = std::max<int64_t>(work_per_item, 1);
  return std::max(at_least, (kMinChunkWork + per_item - 1) / per_item);
}

}  // namespace specdec
