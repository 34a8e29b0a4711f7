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
// number of threads. The keys are selection_keys.h's, the threshold threshold_search.h's.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "avx512_paths.h"
#include "chunks.h"
#include "selection_keys.h"
#include "threshold_search.h"

#include <algorithm>
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
using mmdropit_select::count_around;
using mmdropit_select::DrawnKeys;
using mmdropit_select::find_threshold;
using mmdropit_select::kHasLanes;
using mmdropit_select::lanes_of;
using mmdropit_select::magnitude_key;
using mmdropit_select::MagnitudeKeys;

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

// Writes, for each chunk, its kept elements (key > threshold, then the chunk's quota of ties)
// as a bitmask or as indices, and their values (times `scale` where it is not 1, in the
// precision of PyTorch's product by a number), at the chunk's offset.
template <typename scalar_t, typename index_t, typename Keys>
void write_kept(const scalar_t* data, const Keys& key_at, const Chunks& chunks,
                int64_t threshold, const KeptPerChunk& kept, double scale, uint8_t* bitmask,
                index_t* indices, scalar_t* values) {
  using opmath_t = at::opmath_type<scalar_t>;
  for_each_chunk(chunks, [&](int64_t c, int64_t begin, int64_t end) {
    if constexpr (kHasLanes<Keys> && std::is_same_v<scalar_t, float> &&
                  std::is_same_v<index_t, int32_t>) {
      if (mmdropit_avx512::supported()) {
        return mmdropit_avx512::write_kept(
            data, lanes_of(key_at), begin, end, threshold, kept.ties[c], float(scale), bitmask,
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
