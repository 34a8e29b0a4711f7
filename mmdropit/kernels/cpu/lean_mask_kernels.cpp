// The 1-bit masks of the lean activations (mmdropit/dropit/lean_activations.py), one pass each
// instead of a comparison, a boolean tensor and a multiply-and-sum packing (forward) and an
// unpacking and a `where` (backward):
//
//   pack_between(flat, low, high, bounded)  bit i = low < x_i (and x_i < high when `bounded`),
//                                           packed 8 to a byte, element i at bit i % 8
//   where_bits(grad, bits)                  grad where the bit is set, zero elsewhere
//
// Bounds are compared in the tensor's dtype, as `x > low` is in PyTorch.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <type_traits>

#include "avx512_paths.h"
#include "chunks.h"

namespace {

using mmdropit_chunks::Chunks;
using mmdropit_chunks::chunks_of;
using mmdropit_chunks::for_each_chunk;

__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
void pack_chunk_avx512(const float* x, int64_t begin, int64_t end, float low, float high,
                       bool bounded, uint8_t* bits) {
  const __m512 lo = _mm512_set1_ps(low), hi = _mm512_set1_ps(high);
  for (int64_t i = begin; i < end; i += 16) {
    const __mmask16 valid = mmdropit_avx512::step_mask(i, end);
    const __m512 v = _mm512_maskz_loadu_ps(valid, x + i);
    __mmask16 mask = _mm512_mask_cmp_ps_mask(valid, v, lo, _CMP_GT_OQ);
    if (bounded) mask &= _mm512_mask_cmp_ps_mask(valid, v, hi, _CMP_LT_OQ);
    bits[i / 8] = uint8_t(mask);
    if (end - i > 8) bits[i / 8 + 1] = uint8_t(mask >> 8);
  }
}

template <typename scalar_t>
void pack_chunk(const scalar_t* x, int64_t begin, int64_t end, float low, float high,
                bool bounded, uint8_t* bits) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (mmdropit_avx512::supported()) {
      return pack_chunk_avx512(x, begin, end, low, high, bounded, bits);
    }
  }
  for (int64_t group = begin; group < end; group += 8) {
    const int stop = int(std::min<int64_t>(8, end - group));
    uint32_t byte = 0;
    for (int t = 0; t < stop; ++t) {
      const float v = static_cast<float>(x[group + t]);
      byte |= uint32_t(v > low && (!bounded || v < high)) << t;
    }
    bits[group / 8] = uint8_t(byte);
  }
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
void where_chunk_avx512(const float* grad, const uint8_t* bits, int64_t begin, int64_t end,
                        float* out) {
  for (int64_t i = begin; i < end; i += 16) {
    const __mmask16 valid = mmdropit_avx512::step_mask(i, end);
    uint32_t mask = bits[i / 8];
    if (end - i > 8) mask |= uint32_t(bits[i / 8 + 1]) << 8;
    _mm512_mask_storeu_ps(out + i, valid, _mm512_maskz_loadu_ps(__mmask16(mask) & valid, grad + i));
  }
}

template <typename scalar_t>
void where_chunk(const scalar_t* grad, const uint8_t* bits, int64_t begin, int64_t end,
                 scalar_t* out) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (mmdropit_avx512::supported()) return where_chunk_avx512(grad, bits, begin, end, out);
  }
  for (int64_t i = begin; i < end; ++i) {
    out[i] = (bits[i / 8] >> (i % 8)) & 1u ? grad[i] : scalar_t(0);
  }
}

at::Tensor pack_between(const at::Tensor& flat, double low, double high, bool bounded) {
  TORCH_CHECK(flat.dim() == 1 && flat.is_contiguous() && flat.device().is_cpu(),
              "pack_between: expects a contiguous 1-d CPU tensor");
  const int64_t numel = flat.numel();
  at::Tensor bits = at::empty({(numel + 7) / 8}, flat.options().dtype(at::kByte));
  if (numel == 0) return bits;
  const Chunks chunks = chunks_of(numel);
  uint8_t* out = bits.mutable_data_ptr<uint8_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, flat.scalar_type(), "pack_between",
                                  [&] {
    const scalar_t* x = flat.const_data_ptr<scalar_t>();
    const float lo = static_cast<float>(static_cast<scalar_t>(low));
    const float hi = static_cast<float>(static_cast<scalar_t>(high));
    for_each_chunk(chunks, [&](int64_t, int64_t begin, int64_t end) {
      pack_chunk(x, begin, end, lo, hi, bounded, out);
    });
  });
  return bits;
}

at::Tensor where_bits(const at::Tensor& grad, const at::Tensor& bits) {
  TORCH_CHECK(grad.dim() == 1 && grad.is_contiguous() && grad.device().is_cpu(),
              "where_bits: expects a contiguous 1-d CPU tensor");
  const int64_t numel = grad.numel();
  TORCH_CHECK(bits.scalar_type() == at::kByte && bits.is_contiguous()
                  && bits.numel() == (numel + 7) / 8,
              "where_bits: expects ceil(numel / 8) packed bytes");
  at::Tensor out = at::empty_like(grad);
  if (numel == 0) return out;
  const Chunks chunks = chunks_of(numel);
  const uint8_t* b = bits.const_data_ptr<uint8_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, grad.scalar_type(), "where_bits",
                                  [&] {
    const scalar_t* g = grad.const_data_ptr<scalar_t>();
    scalar_t* o = out.mutable_data_ptr<scalar_t>();
    for_each_chunk(chunks, [&](int64_t, int64_t begin, int64_t end) {
      where_chunk(g, b, begin, end, o);
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mmdropit_cpu, m) {
  m.def("pack_between(Tensor flat, float low, float high, bool bounded) -> Tensor");
  m.def("where_bits(Tensor grad, Tensor bits) -> Tensor");
}

TORCH_LIBRARY_IMPL(mmdropit_cpu, CPU, m) {
  m.impl("pack_between", &pack_between);
  m.impl("where_bits", &where_bits);
}
