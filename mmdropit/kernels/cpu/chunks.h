// The parallel chunks every fused kernel cuts its input into: their size depends on numel alone
// (a multiple of 64 elements, so every chunk owns whole bitmask bytes, and at most kMaxChunks of
// them), and they run in parallel with at::parallel_for, so results do not depend on the number
// of threads.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

namespace mmdropit_chunks {

constexpr int64_t kMinChunk = 1 << 15;
constexpr int64_t kMaxChunks = 64;

struct Chunks {
  int64_t numel;
  int64_t size;
  int64_t count;
  int64_t begin(int64_t c) const { return c * size; }
  int64_t end(int64_t c) const { return std::min(numel, (c + 1) * size); }
};

inline Chunks chunks_of(int64_t numel) {
  int64_t size = (numel + kMaxChunks - 1) / kMaxChunks;
  size = std::max(kMinChunk, (size + 63) / 64 * 64);
  return Chunks{numel, size, std::max<int64_t>(1, (numel + size - 1) / size)};
}

template <typename F>
void for_each_chunk(const Chunks& chunks, const F& body) {
  at::parallel_for(0, chunks.count, 1, [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) body(c, chunks.begin(c), chunks.end(c));
  });
}

}  // namespace mmdropit_chunks
