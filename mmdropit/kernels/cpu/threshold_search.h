// The exact `rank`-th smallest key of an input (selection_keys.h) and, per chunk, the keys
// above it and equal to it: a sampled bracket and one counting pass on large inputs, radix
// histograms where the bracket misses and on mid-sized inputs, nth_element on small ones.
// Chunks run in parallel (chunks.h); results do not depend on the number of threads.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <vector>

#include "avx512_paths.h"
#include "chunks.h"
#include "selection_keys.h"

namespace mmdropit_select {

using mmdropit_chunks::Chunks;
using mmdropit_chunks::for_each_chunk;

// Histogram of the keys' bits [shift, shift + bits) over the keys whose bits above that range
// equal `prefix` (all keys when `bits` reaches bit 31). Each thread counts into four interleaved
// copies, so that runs of equal buckets do not wait on each other's increments.
template <typename Keys>
std::vector<int64_t> key_histogram(const Keys& key_at, const Chunks& chunks, int shift,
                                   int bits, uint32_t prefix) {
  const int64_t buckets = int64_t(1) << bits;
  const uint32_t mask = uint32_t(buckets - 1);
  const int above = shift + bits;
  std::vector<int64_t> total(buckets, 0);
  std::mutex merge;
  at::parallel_for(0, chunks.count, 1, [&](int64_t first, int64_t last) {
    // 32-bit counts (a quarter of the cache of 64-bit ones), flushed every 2^31 elements
    std::vector<uint32_t> local(4 * buckets);
    uint32_t* h = local.data();
    std::vector<int64_t> sums(buckets, 0);
    const int64_t range_end = chunks.end(last - 1);
    for (int64_t begin = chunks.begin(first); begin < range_end; begin += int64_t(1) << 31) {
      const int64_t end = std::min(range_end, begin + (int64_t(1) << 31));
      std::fill(local.begin(), local.end(), 0u);
      int64_t i = begin;
      if (above >= 31) {
        for (; i + 4 <= end; i += 4) {
          ++h[key_at(i) >> shift];
          ++h[buckets + (key_at(i + 1) >> shift)];
          ++h[2 * buckets + (key_at(i + 2) >> shift)];
          ++h[3 * buckets + (key_at(i + 3) >> shift)];
        }
        for (; i < end; ++i) ++h[key_at(i) >> shift];
      } else {
        for (; i < end; ++i) {
          const uint32_t key = key_at(i);
          if ((key >> above) == prefix) ++h[(key >> shift) & mask];
        }
      }
      for (int64_t b = 0; b < buckets; ++b) {
        sums[b] += int64_t(h[b]) + h[buckets + b] + h[2 * buckets + b] + h[3 * buckets + b];
      }
    }
    std::lock_guard<std::mutex> lock(merge);
    for (int64_t b = 0; b < buckets; ++b) total[b] += sums[b];
  });
  return total;
}

// The bucket holding the `rank`-th smallest count (1-based); `rank` becomes the rank inside it.
inline int64_t bucket_of_rank(const std::vector<int64_t>& histogram, int64_t& rank) {
  for (size_t b = 0; b < histogram.size(); ++b) {
    if (rank <= histogram[b]) return int64_t(b);
    rank -= histogram[b];
  }
  TORCH_CHECK(false, "DropIT selection: internal error, rank beyond the histogram");
}

constexpr int kTopShift = 20;  // level 0: key bits 30..20 (8 exponent and 3 mantissa bits)

// The `rank`-th smallest key (1-based) among keys whose top bits equal `top_bucket`, resolved
// on the collected keys of that bucket (their bits 19..8, then 7..0).
inline uint32_t select_in_collected(const std::vector<uint32_t>& keys, uint32_t top_bucket,
                             int64_t rank) {
  uint32_t prefix = top_bucket;
  for (const int shift : {8, 0}) {
    const int bits = shift == 8 ? 12 : 8;
    std::vector<int64_t> histogram(int64_t(1) << bits, 0);
    const uint32_t mask = uint32_t(histogram.size() - 1);
    for (const uint32_t key : keys) {
      if ((key >> (shift + bits)) == prefix) ++histogram[(key >> shift) & mask];
    }
    prefix = (prefix << bits) | uint32_t(bucket_of_rank(histogram, rank));
  }
  return prefix;
}

// The `rank`-th smallest key (1-based) by histograms: of the top bits, then either the keys of
// the chosen bucket collected and resolved apart (the usual case: a few percent of the
// elements), or, when that bucket is large (mostly zeros), two more histogram passes.
template <typename Keys>
uint32_t radix_select(const Keys& key_at, const Chunks& chunks, int64_t rank) {
  const std::vector<int64_t> top = key_histogram(key_at, chunks, kTopShift, 11, 0);
  const uint32_t bucket = uint32_t(bucket_of_rank(top, rank));
  if (top[bucket] * 8 > chunks.numel) {
    const std::vector<int64_t> middle = key_histogram(key_at, chunks, 8, 12, bucket);
    const uint32_t prefix = (bucket << 12) | uint32_t(bucket_of_rank(middle, rank));
    const std::vector<int64_t> low = key_histogram(key_at, chunks, 0, 8, prefix);
    return (prefix << 8) | uint32_t(bucket_of_rank(low, rank));
  }
  std::vector<std::vector<uint32_t>> parts(chunks.count);
  for_each_chunk(chunks, [&](int64_t c, int64_t begin, int64_t end) {
    std::vector<uint32_t>& part = parts[c];
    for (int64_t i = begin; i < end; ++i) {
      const uint32_t key = key_at(i);
      if ((key >> kTopShift) == bucket) part.push_back(key);
    }
  });
  std::vector<uint32_t> keys;
  keys.reserve(top[bucket]);
  for (const auto& part : parts) keys.insert(keys.end(), part.begin(), part.end());
  return select_in_collected(keys, bucket, rank);
}

// The sample that brackets the threshold: runs of kLineElements consecutive elements (whole
// cache lines: random single elements cost a cache miss each) at fixed pseudo-random places, one
// line per kElementsPerLine elements of the input, between kMinSampleLines and kMaxSampleLines
// (selecting in a larger sample costs more than it narrows the bracket). The bracket's margin
// assumes a quarter as many independent draws as elements read, since neighbours are alike.
constexpr int64_t kLineElements = 16;
constexpr int64_t kElementsPerLine = 512;
constexpr int64_t kMinSampleLines = 256;
constexpr int64_t kMaxSampleLines = 4096;

// Inputs of at most this many elements select among their keys directly (nth_element): the
// histograms' 64 KiB of counters cost more to zero than such an input costs to select in.
constexpr int64_t kSmallInput = 2048;

// Per chunk, how many keys lie above `threshold` and how many equal it.
template <typename Keys>
void count_around(const Keys& key_at, const Chunks& chunks, int64_t threshold,
                  std::vector<int64_t>& above, std::vector<int64_t>& equal) {
  for_each_chunk(chunks, [&](int64_t c, int64_t begin, int64_t end) {
    if constexpr (kHasLanes<Keys>) {
      if (mmdropit_avx512::supported()) {
        return mmdropit_avx512::count_around(lanes_of(key_at), begin, end, threshold, above[c],
                                             equal[c]);
      }
    }
    int64_t n_above = 0, n_equal = 0;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t key = key_at(i);
      n_above += key > threshold;
      n_equal += key == threshold;
    }
    above[c] = n_above;
    equal[c] = n_equal;
  });
}

// One chunk of the bracket pass: keys at or below `low` counted, above `high` counted, keys in
// between collected.
template <typename Keys>
void bracket_chunk(const Keys& key_at, int64_t begin, int64_t end, uint32_t low, uint32_t high,
                   int64_t& below, int64_t& above, std::vector<uint32_t>& band) {
  if constexpr (kHasLanes<Keys>) {
    if (mmdropit_avx512::supported()) {
      return mmdropit_avx512::bracket(lanes_of(key_at), begin, end, low, high, below, above,
                                      band);
    }
  }
  int64_t n_below = 0, n_above = 0;
  for (int64_t i = begin; i < end; ++i) {
    const uint32_t key = key_at(i);
    n_below += key <= low;
    n_above += key > high;
    if (key > low && key <= high) band.push_back(key);
  }
  below = n_below;
  above = n_above;
}

// The `rank`-th smallest key (1-based), exactly, and per chunk how many keys lie
// above it and equal it. On large inputs the quantiles of a sample bracket it; one pass counts
// the keys on either side of the bracket and collects those inside (a few percent), where the
// key is selected. When the bracket misses (the keys below it reach the rank, or those inside
// do not), and on mid-sized inputs, histograms find it and one more pass counts; inputs of at
// most kSmallInput elements select among their keys.
template <typename Keys>
int64_t find_threshold(const Keys& key_at, const Chunks& chunks, int64_t rank,
                       std::vector<int64_t>& above, std::vector<int64_t>& equal) {
  const int64_t numel = chunks.numel;
  if (numel <= kSmallInput) {  // the keys themselves: cheaper than zeroing the histograms
    std::vector<uint32_t> keys(numel);
    for (int64_t i = 0; i < numel; ++i) keys[i] = key_at(i);
    std::nth_element(keys.begin(), keys.begin() + (rank - 1), keys.end());
    const int64_t threshold = keys[rank - 1];
    count_around(key_at, chunks, threshold, above, equal);
    return threshold;
  }
  const int64_t sample_lines = std::min(kMaxSampleLines, numel / kElementsPerLine);
  const int64_t sample_size = sample_lines * kLineElements;
  const double quantile = double(rank) / double(numel);
  const double margin = sample_lines < kMinSampleLines ? 1.0
      : 5 * std::sqrt(quantile * (1 - quantile) / double(sample_size / 4)) + 2.0 / sample_size;
  const int64_t low_rank = int64_t((quantile - margin) * sample_size);
  const int64_t high_rank = int64_t(std::ceil((quantile + margin) * sample_size));
  if (sample_lines >= kMinSampleLines && low_rank >= 1 && high_rank <= sample_size) {
    std::vector<uint32_t> sample(sample_size);
    const uint64_t lines = uint64_t(numel / kLineElements);
    for (int64_t j = 0; j < sample_lines; ++j) {
      const int64_t line = int64_t(mix(j) % lines) * kLineElements;
      for (int64_t e = 0; e < kLineElements; ++e) {
        sample[j * kLineElements + e] = key_at(line + e);
      }
    }
    std::nth_element(sample.begin(), sample.begin() + (high_rank - 1), sample.end());
    const uint32_t high = sample[high_rank - 1];
    std::nth_element(sample.begin(), sample.begin() + (low_rank - 1), sample.begin() + high_rank);
    const uint32_t low = sample[low_rank - 1];
    std::vector<int64_t> below(chunks.count, 0);
    std::vector<std::vector<uint32_t>> parts(chunks.count);
    for_each_chunk(chunks, [&](int64_t c, int64_t begin, int64_t end) {
      bracket_chunk(key_at, begin, end, low, high, below[c], above[c], parts[c]);
    });
    int64_t n_below = 0, n_band = 0;
    for (int64_t c = 0; c < chunks.count; ++c) {
      n_below += below[c];
      n_band += int64_t(parts[c].size());
    }
    if (n_below < rank && rank <= n_below + n_band) {
      std::vector<uint32_t> band;
      band.reserve(n_band);
      for (const auto& part : parts) band.insert(band.end(), part.begin(), part.end());
      std::nth_element(band.begin(), band.begin() + (rank - n_below - 1), band.end());
      const uint32_t threshold = band[rank - n_below - 1];
      for (int64_t c = 0; c < chunks.count; ++c) {
        for (const uint32_t key : parts[c]) {
          above[c] += key > threshold;
          equal[c] += key == threshold;
        }
      }
      return threshold;
    }
  }
  const int64_t threshold = radix_select(key_at, chunks, rank);
  count_around(key_at, chunks, threshold, above, equal);
  return threshold;
}

}  // namespace mmdropit_select
