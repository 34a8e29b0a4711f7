// DropIT's selection, compaction and rebuilding as fused CPU kernels (operators mmdropit_cpu::*).
//
// The eager path (mmdropit/dropit/strategies.py, compact.py) makes 6-8 passes over a layer's
// input: abs, comparisons, kthvalue, nonzero, index_select, bit packing; and in backward bit
// unpacking and masked_scatter. Here each of those is one or a few parallel passes:
//
//   keep_topk      exact min-k: a radix select on the bit pattern of |x| (11 + 12 + 8 bits, one
//                  histogram pass per level, later levels only count the elements still in the
//                  running), then one pass that writes the bitmask (or indices) and the kept
//                  values in memory order. Ties at the threshold are kept first in memory order,
//                  exactly as the eager `mink` does, so both paths give bit-identical tensors.
//   above_counts   per-chunk counts of |x| > threshold (mink_approx's sampled threshold) ...
//   write_above    ... and the pass that writes those elements, once the caller has chosen the
//                  encoding from the total.
//   keep_random    `random`: the same select and write over a counter-based random key per
//                  element (SplitMix64's stream from a seed drawn from the caller's generator),
//                  the kept values scaled: a fixed count drawn uniformly without replacement.
//   scatter_bitmask  backward: the dense tensor (dropped elements zero) from bitmask + values,
//                  one pass, written straight into the buffer the weight-gradient GEMM reads.
//
// The input is cut into chunks (chunks.h) that run in parallel; results do not depend on the
// number of threads.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "avx512_paths.h"
#include "chunks.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

using mmdropit_chunks::Chunks;
using mmdropit_chunks::chunks_of;
using mmdropit_chunks::for_each_chunk;

// The bit pattern of |v| as a float: its order is the order of magnitudes (NaN above inf).
template <typename scalar_t>
inline uint32_t magnitude_key(scalar_t v) {
  float f = static_cast<float>(v);
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits & 0x7fffffffu;
}

// The keys a selection keeps the largest of, each below 2^31 (the radix levels' range), by index.
// MagnitudeKeys: |x| (mink, mink_approx).
template <typename scalar_t>
struct MagnitudeKeys {
  const scalar_t* data;
  uint32_t operator()(int64_t i) const { return magnitude_key(data[i]); }
};

// SplitMix64's step and finaliser: pseudo-random numbers of a counter, no generator state.
inline uint64_t mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// DrawnKeys: element i's key is the top 30 bits of the i-th number of SplitMix64's stream from
// `seed` (random): keeping the largest keys keeps a set drawn uniformly without replacement.
// The Triton kernel draws the same keys (as float32 bit patterns below 2.0: never NaN).
struct DrawnKeys {
  uint64_t seed;
  uint32_t operator()(int64_t i) const {
    return uint32_t(mix(seed + uint64_t(i) * 0x9E3779B97F4A7C15ull) >> 34);
  }
};

// Whether the AVX-512 paths (float magnitudes) take this key source.
template <typename Keys>
constexpr bool kFloatMagnitudes = std::is_same_v<Keys, MagnitudeKeys<float>>;

// How many elements of each chunk are kept, and at which output position the chunk starts.
struct KeptPerChunk {
  std::vector<int64_t> above;   // elements strictly above the threshold
  std::vector<int64_t> ties;    // elements equal to it that are kept (first in memory order)
  std::vector<int64_t> offset;  // position of the chunk's first kept element
  int64_t total = 0;

  explicit KeptPerChunk(int64_t count) : above(count, 0), ties(count, 0), offset(count, 0) {}

  void finish() {
    total = 0;
    for (size_t c = 0; c < above.size(); ++c) {
      offset[c] = total;
      total += above[c] + ties[c];
    }
  }
};

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
int64_t bucket_of_rank(const std::vector<int64_t>& histogram, int64_t& rank) {
  for (size_t b = 0; b < histogram.size(); ++b) {
    if (rank <= histogram[b]) return int64_t(b);
    rank -= histogram[b];
  }
  TORCH_CHECK(false, "DropIT selection: internal error, rank beyond the histogram");
}

constexpr int kTopShift = 20;  // level 0: key bits 30..20 (8 exponent and 3 mantissa bits)

// The `rank`-th smallest key (1-based) among keys whose top bits equal `top_bucket`, resolved
// on the collected keys of that bucket (their bits 19..8, then 7..0).
uint32_t select_in_collected(const std::vector<uint32_t>& keys, uint32_t top_bucket,
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
    if constexpr (kFloatMagnitudes<Keys>) {
      if (mmdropit_avx512::supported()) {
        return mmdropit_avx512::count_around(key_at.data, begin, end, threshold, above[c],
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
  if constexpr (kFloatMagnitudes<Keys>) {
    if (mmdropit_avx512::supported()) {
      return mmdropit_avx512::bracket(key_at.data, begin, end, low, high, below, above, band);
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

// Writes, for each chunk, its kept elements (key > threshold, then the chunk's quota of ties)
// as a bitmask or as indices, and their values (times `scale` where it is not 1, in the
// precision of PyTorch's product by a number), at the chunk's offset.
template <typename scalar_t, typename index_t, typename Keys>
void write_kept(const scalar_t* data, const Keys& key_at, const Chunks& chunks,
                int64_t threshold, const KeptPerChunk& kept, double scale, uint8_t* bitmask,
                index_t* indices, scalar_t* values) {
  using opmath_t = at::opmath_type<scalar_t>;
  for_each_chunk(chunks, [&](int64_t c, int64_t begin, int64_t end) {
    if constexpr (kFloatMagnitudes<Keys> && std::is_same_v<index_t, int32_t>) {
      if (mmdropit_avx512::supported() && scale == 1.0) {
        return mmdropit_avx512::write_kept(
            data, begin, end, threshold, kept.ties[c], bitmask,
            indices == nullptr ? nullptr : indices + kept.offset[c], values + kept.offset[c]);
      }
    }
    // Kept values (and indices) go to a small staging buffer without branches, then out.
    constexpr int kStage = 1024;
    scalar_t staged[kStage + 8];
    index_t staged_index[kStage + 8];
    int pos = 0;
    int64_t out = kept.offset[c];
    int64_t ties_left = kept.ties[c];
    for (int64_t group = begin; group < end; group += 8) {
      const int stop = int(std::min<int64_t>(8, end - group));
      uint32_t byte = 0, tie_bits = 0;
      for (int t = 0; t < stop; ++t) {
        const int64_t key = key_at(group + t);
        byte |= uint32_t(key > threshold) << t;
        tie_bits |= uint32_t(key == threshold) << t;
      }
      for (; tie_bits != 0 && ties_left > 0; tie_bits &= tie_bits - 1, --ties_left) {
        byte |= 1u << __builtin_ctz(tie_bits);  // ties in memory order, up to the chunk's quota
      }
      if (bitmask != nullptr) bitmask[group / 8] = uint8_t(byte);
      for (int t = 0; t < stop; ++t) {
        staged[pos] = data[group + t];
        if (indices != nullptr) staged_index[pos] = index_t(group + t);
        pos += (byte >> t) & 1u;
      }
      if (pos >= kStage || group + 8 >= end) {
        if (scale != 1.0) {
          for (int j = 0; j < pos; ++j) {
            staged[j] = scalar_t(opmath_t(staged[j]) * opmath_t(scale));
          }
        }
        std::memcpy(values + out, staged, pos * sizeof(scalar_t));
        if (indices != nullptr) std::memcpy(indices + out, staged_index, pos * sizeof(index_t));
        out += pos;
        pos = 0;
      }
    }
  });
}

std::tuple<at::Tensor, at::Tensor> allocate_kept(const at::Tensor& flat, int64_t kept,
                                                 bool bitmask) {
  const int64_t numel = flat.numel();
  at::Tensor first = bitmask
      ? at::empty({(numel + 7) / 8}, flat.options().dtype(at::kByte))
      : at::empty({kept}, flat.options().dtype(numel <= INT32_MAX ? at::kInt : at::kLong));
  return {first, at::empty({kept}, flat.options())};
}

template <typename scalar_t, typename Keys>
void write_encoded(const at::Tensor& flat, const Keys& key_at, const Chunks& chunks,
                   int64_t threshold, const KeptPerChunk& kept, double scale, at::Tensor& first,
                   at::Tensor& values, bool bitmask) {
  const scalar_t* data = flat.const_data_ptr<scalar_t>();
  scalar_t* out = values.mutable_data_ptr<scalar_t>();
  if (bitmask) {
    write_kept<scalar_t, int32_t>(data, key_at, chunks, threshold, kept, scale,
                                  first.mutable_data_ptr<uint8_t>(), nullptr, out);
  } else if (first.scalar_type() == at::kInt) {
    write_kept<scalar_t, int32_t>(data, key_at, chunks, threshold, kept, scale, nullptr,
                                  first.mutable_data_ptr<int32_t>(), out);
  } else {
    write_kept<scalar_t, int64_t>(data, key_at, chunks, threshold, kept, scale, nullptr,
                                  first.mutable_data_ptr<int64_t>(), out);
  }
}

void check_flat(const at::Tensor& flat, const char* op) {
  TORCH_CHECK(flat.dim() == 1 && flat.is_contiguous(), op, ": expects a contiguous 1-d tensor");
  TORCH_CHECK(flat.device().is_cpu(), op, ": expects a CPU tensor");
}

// The `kept` elements of `flat` with the largest keys (ties first in memory order), encoded,
// their values times `scale`.
template <typename scalar_t, typename Keys>
void keep_largest_keys(const at::Tensor& flat, const Keys& key_at, int64_t kept, double scale,
                       at::Tensor& first, at::Tensor& values, bool bitmask) {
  const int64_t numel = flat.numel();
  const Chunks chunks = chunks_of(numel);
  KeptPerChunk per_chunk(chunks.count);
  int64_t threshold = -1;  // kept == numel: every key lies above it
  std::vector<int64_t> equal(chunks.count, 0);
  if (kept < numel) {
    threshold = find_threshold(key_at, chunks, numel - kept, per_chunk.above, equal);
  } else {
    for (int64_t c = 0; c < chunks.count; ++c) {
      per_chunk.above[c] = chunks.end(c) - chunks.begin(c);
    }
  }
  int64_t missing = kept;
  for (int64_t c = 0; c < chunks.count; ++c) missing -= per_chunk.above[c];
  for (int64_t c = 0; c < chunks.count; ++c) {
    per_chunk.ties[c] = std::min(equal[c], missing);
    missing -= per_chunk.ties[c];
  }
  TORCH_CHECK(missing == 0, "DropIT selection: internal error, ties do not fill the count");
  per_chunk.finish();
  write_encoded<scalar_t>(flat, key_at, chunks, threshold, per_chunk, scale, first, values,
                          bitmask);
}

std::tuple<at::Tensor, at::Tensor> keep_topk(const at::Tensor& flat, int64_t kept, bool bitmask) {
  check_flat(flat, "keep_topk");
  TORCH_CHECK(0 <= kept && kept <= flat.numel(), "keep_topk: kept must lie in [0, numel]");
  auto [first, values] = allocate_kept(flat, kept, bitmask);
  if (flat.numel() == 0) return {first, values};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, flat.scalar_type(), "keep_topk", [&] {
    const MagnitudeKeys<scalar_t> magnitudes{flat.const_data_ptr<scalar_t>()};
    keep_largest_keys<scalar_t>(flat, magnitudes, kept, 1.0, first, values, bitmask);
  });
  return {first, values};
}

// The seed is one 64-bit draw from `generator` (the default CPU generator without one).
std::tuple<at::Tensor, at::Tensor> keep_random(const at::Tensor& flat, int64_t kept,
                                               bool bitmask, double scale,
                                               std::optional<at::Generator> generator) {
  check_flat(flat, "keep_random");
  TORCH_CHECK(0 <= kept && kept <= flat.numel(), "keep_random: kept must lie in [0, numel]");
  auto [first, values] = allocate_kept(flat, kept, bitmask);
  auto* source = at::get_generator_or_default<at::CPUGeneratorImpl>(
      generator, at::detail::getDefaultCPUGenerator());
  uint64_t seed;
  {
    std::lock_guard<std::mutex> lock(source->mutex_);
    seed = source->random64();
  }
  if (flat.numel() == 0) return {first, values};
  const DrawnKeys drawn{seed};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, flat.scalar_type(), "keep_random",
                                  [&] {
    keep_largest_keys<scalar_t>(flat, drawn, kept, scale, first, values, bitmask);
  });
  return {first, values};
}

at::Tensor above_counts(const at::Tensor& flat, double threshold) {
  check_flat(flat, "above_counts");
  const Chunks chunks = chunks_of(flat.numel());
  at::Tensor counts = at::zeros({chunks.count}, flat.options().dtype(at::kLong));
  if (flat.numel() == 0) return counts;
  std::vector<int64_t> above(chunks.count, 0), equal(chunks.count, 0);
  const uint32_t key = magnitude_key(static_cast<float>(threshold));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, flat.scalar_type(), "above_counts",
                                  [&] {
    const MagnitudeKeys<scalar_t> magnitudes{flat.const_data_ptr<scalar_t>()};
    count_around(magnitudes, chunks, key, above, equal);
  });
  std::copy(above.begin(), above.end(), counts.mutable_data_ptr<int64_t>());
  return counts;
}

std::tuple<at::Tensor, at::Tensor> write_above(const at::Tensor& flat, double threshold,
                                               const at::Tensor& counts, bool bitmask) {
  check_flat(flat, "write_above");
  const Chunks chunks = chunks_of(flat.numel());
  TORCH_CHECK(counts.numel() == chunks.count && counts.scalar_type() == at::kLong,
              "write_above: counts must come from above_counts on the same tensor");
  KeptPerChunk per_chunk(chunks.count);
  const int64_t* given = counts.const_data_ptr<int64_t>();
  std::copy(given, given + chunks.count, per_chunk.above.begin());
  per_chunk.finish();
  auto [first, values] = allocate_kept(flat, per_chunk.total, bitmask);
  if (flat.numel() == 0) return {first, values};
  const uint32_t key = magnitude_key(static_cast<float>(threshold));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, flat.scalar_type(), "write_above",
                                  [&] {
    const MagnitudeKeys<scalar_t> magnitudes{flat.const_data_ptr<scalar_t>()};
    write_encoded<scalar_t>(flat, magnitudes, chunks, key, per_chunk, 1.0, first, values,
                            bitmask);
  });
  return {first, values};
}

template <typename scalar_t>
void scatter_chunks(const uint8_t* bits, const scalar_t* values, int64_t count,
                    const Chunks& chunks, const std::vector<int64_t>& offset, scalar_t* dense) {
  for_each_chunk(chunks, [&](int64_t c, int64_t begin, int64_t end) {
    if constexpr (std::is_same_v<scalar_t, float>) {
      if (mmdropit_avx512::supported()) {
        return mmdropit_avx512::scatter_bitmask(bits, values + offset[c], begin, end, dense);
      }
    }
    int64_t in = offset[c];
    const int64_t last = std::max<int64_t>(count - 1, 0);
    for (int64_t group = begin; group < end; group += 8) {
      const uint32_t byte = bits[group / 8];
      const int stop = int(std::min<int64_t>(8, end - group));
      for (int t = 0; t < stop; ++t) {  // no branch on the bit: read a value, keep it or zero
        const uint32_t bit = (byte >> t) & 1u;
        const scalar_t value = values[std::min(in, last)];
        dense[group + t] = bit ? value : scalar_t(0);
        in += bit;
      }
    }
  });
}

at::Tensor scatter_bitmask(const at::Tensor& bitmask, const at::Tensor& values, int64_t numel) {
  TORCH_CHECK(bitmask.scalar_type() == at::kByte && bitmask.is_contiguous() &&
                  bitmask.numel() == (numel + 7) / 8,
              "scatter_bitmask: expects ceil(numel / 8) packed bytes");
  TORCH_CHECK(values.dim() == 1 && values.is_contiguous(), "scatter_bitmask: 1-d values");
  at::Tensor dense = at::empty({numel}, values.options());
  if (numel == 0) return dense;
  const Chunks chunks = chunks_of(numel);
  const uint8_t* bits = bitmask.const_data_ptr<uint8_t>();
  std::vector<int64_t> offset(chunks.count, 0);
  for_each_chunk(chunks, [&](int64_t c, int64_t begin, int64_t end) {
    int64_t n = 0;
    for (int64_t byte = begin / 8; byte < (end + 7) / 8; ++byte) {
      n += __builtin_popcount(bits[byte]);
    }
    offset[c] = n;
  });
  int64_t total = 0;
  for (int64_t c = 0; c < chunks.count; ++c) {
    const int64_t n = offset[c];
    offset[c] = total;
    total += n;
  }
  TORCH_CHECK(total == values.numel(), "scatter_bitmask: the bitmask sets ", total,
              " bits for ", values.numel(), " values");
  if (total == 0) return dense.zero_();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, values.scalar_type(),
                                  "scatter_bitmask", [&] {
    scatter_chunks<scalar_t>(bits, values.const_data_ptr<scalar_t>(), total, chunks, offset,
                             dense.mutable_data_ptr<scalar_t>());
  });
  return dense;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mmdropit_cpu, m) {
  m.def("keep_topk(Tensor flat, int kept, bool bitmask) -> (Tensor, Tensor)");
  m.def("keep_random(Tensor flat, int kept, bool bitmask, float scale, Generator? generator)"
        " -> (Tensor, Tensor)");
  m.def("above_counts(Tensor flat, float threshold) -> Tensor");
  m.def("write_above(Tensor flat, float threshold, Tensor counts, bool bitmask)"
        " -> (Tensor, Tensor)");
  m.def("scatter_bitmask(Tensor bitmask, Tensor values, int numel) -> Tensor");
}

TORCH_LIBRARY_IMPL(mmdropit_cpu, CPU, m) {
  m.impl("keep_topk", &keep_topk);
  m.impl("keep_random", &keep_random);
  m.impl("above_counts", &above_counts);
  m.impl("write_above", &write_above);
  m.impl("scatter_bitmask", &scatter_bitmask);
}
