// The per-group int8 code of saved activations (mmdropit/codecs/int8.py), one pass each way
// instead of the eager path's chunks of padding, absolute value, maximum, division, rounding and
// conversion (forward) and of conversion and multiplication (backward):
//
//   quantize_int8(flat)                 per group of 32 values: scale = max|v| * (1.0f / 127.0f)
//                                       (max|v| at least the smallest normal float), codes
//                                       round(v / scale) to the nearest, ties to even
//   dequantize_int8(codes, scales, dtype)  code * scale, in dtype
//
// Every result equals the eager path's bit for bit: the same operations in the same order. The
// scale is a product by the float32 reciprocal of 127, not a quotient, as in the eager path and
// the Triton kernel: PyTorch divides a CUDA tensor by a number that way, so a product keeps
// every device's scales the same.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "avx512_paths.h"
#include "codec_groups.h"

namespace {

using mmdropit_codecs::kGroup;
using mmdropit_codecs::kGroupsPerTask;

constexpr float kInverse127 = 1.0f / 127.0f;  // float32(1 / 127), as the eager path's mul

inline float scale_of(float largest) {
  return std::max(largest, std::numeric_limits<float>::min()) * kInverse127;
}

template <typename scalar_t>
__attribute__((always_inline)) inline void quantize_groups(const scalar_t* x, int64_t numel,
                                                           int64_t first, int64_t last,
                                                           int8_t* codes, float* scales) {
  for (int64_t group = first; group < last; ++group) {
    const int64_t base = group * kGroup;
    const int64_t count = std::min(kGroup, numel - base);
    float largest = 0.0f;
    for (int64_t t = 0; t < count; ++t) {
      largest = std::max(largest, std::abs(static_cast<float>(x[base + t])));
    }
    const float scale = scale_of(largest);
    scales[group] = scale;
    for (int64_t t = 0; t < count; ++t) {
      codes[base + t] = int8_t(std::nearbyint(static_cast<float>(x[base + t]) / scale));
    }
  }
}

// Whole groups of float32 values in AVX-512 registers, 16 values at a time.
MMDROPIT_CODEC_AVX512 void quantize_whole_groups_avx512(const float* x, int64_t first,
                                                        int64_t last, int8_t* codes,
                                                        float* scales) {
  for (int64_t group = first; group < last; ++group) {
    const int64_t base = group * kGroup;
    const __m512 a = _mm512_loadu_ps(x + base), b = _mm512_loadu_ps(x + base + 16);
    const float scale = scale_of(_mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a),
                                                                    _mm512_abs_ps(b))));
    scales[group] = scale;
    const __m512 scales_v = _mm512_set1_ps(scale);
    const int rounding = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const __m512i low = _mm512_cvtps_epi32(
        _mm512_roundscale_ps(_mm512_div_ps(a, scales_v), rounding));
    const __m512i high = _mm512_cvtps_epi32(
        _mm512_roundscale_ps(_mm512_div_ps(b, scales_v), rounding));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + base), _mm512_cvtepi32_epi8(low));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + base + 16), _mm512_cvtepi32_epi8(high));
  }
}

template <typename scalar_t>
MMDROPIT_CODEC_AVX512 void quantize_groups_avx512(const scalar_t* x, int64_t numel, int64_t first,
                                                  int64_t last, int8_t* codes, float* scales) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    const int64_t whole = std::max(first, std::min(last, numel / kGroup));
    quantize_whole_groups_avx512(x, first, whole, codes, scales);
    first = whole;
  }
  quantize_groups<scalar_t>(x, numel, first, last, codes, scales);
}

template <typename scalar_t>
void quantize_groups_portable(const scalar_t* x, int64_t numel, int64_t first, int64_t last,
                              int8_t* codes, float* scales) {
  quantize_groups<scalar_t>(x, numel, first, last, codes, scales);
}

template <typename scalar_t>
__attribute__((always_inline)) inline void dequantize_groups(const int8_t* codes,
                                                             const float* scales, int64_t numel,
                                                             int64_t first, int64_t last,
                                                             scalar_t* out) {
  for (int64_t group = first; group < last; ++group) {
    const int64_t base = group * kGroup;
    const int64_t count = std::min(kGroup, numel - base);
    const float scale = scales[group];
    for (int64_t t = 0; t < count; ++t) {
      out[base + t] = static_cast<scalar_t>(float(codes[base + t]) * scale);
    }
  }
}

template <typename scalar_t>
MMDROPIT_CODEC_AVX512 void dequantize_groups_avx512(const int8_t* codes, const float* scales,
                                                    int64_t numel, int64_t first, int64_t last,
                                                    scalar_t* out) {
  dequantize_groups<scalar_t>(codes, scales, numel, first, last, out);
}

template <typename scalar_t>
void dequantize_groups_portable(const int8_t* codes, const float* scales, int64_t numel,
                                int64_t first, int64_t last, scalar_t* out) {
  dequantize_groups<scalar_t>(codes, scales, numel, first, last, out);
}

std::tuple<at::Tensor, at::Tensor> quantize_int8(const at::Tensor& flat) {
  TORCH_CHECK(flat.dim() == 1 && flat.is_contiguous() && flat.device().is_cpu(),
              "quantize_int8: expects a contiguous 1-d CPU tensor");
  const int64_t numel = flat.numel(), groups = (numel + kGroup - 1) / kGroup;
  at::Tensor codes = at::empty({numel}, flat.options().dtype(at::kChar));
  at::Tensor scales = at::empty({groups}, flat.options().dtype(at::kFloat));
  if (groups == 0) return {codes, scales};
  int8_t* c = codes.mutable_data_ptr<int8_t>();
  float* s = scales.mutable_data_ptr<float>();
  const bool wide = mmdropit_avx512::supported();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, flat.scalar_type(), "quantize_int8",
                                  [&] {
    const scalar_t* x = flat.const_data_ptr<scalar_t>();
    at::parallel_for(0, groups, kGroupsPerTask, [&](int64_t first, int64_t last) {
      if (wide) {
        quantize_groups_avx512<scalar_t>(x, numel, first, last, c, s);
      } else {
        quantize_groups_portable<scalar_t>(x, numel, first, last, c, s);
      }
    });
  });
  return {codes, scales};
}

at::Tensor dequantize_int8(const at::Tensor& codes, const at::Tensor& scales,
                           at::ScalarType dtype) {
  const int64_t numel = codes.numel(), groups = (numel + kGroup - 1) / kGroup;
  TORCH_CHECK(codes.scalar_type() == at::kChar && codes.is_contiguous() && codes.dim() == 1,
              "dequantize_int8: expects contiguous 1-d int8 codes");
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.is_contiguous()
                  && scales.numel() == groups,
              "dequantize_int8: expects a float32 scale per group of ", kGroup);
  at::Tensor out = at::empty({numel}, codes.options().dtype(dtype));
  if (groups == 0) return out;
  const int8_t* c = codes.const_data_ptr<int8_t>();
  const float* s = scales.const_data_ptr<float>();
  const bool wide = mmdropit_avx512::supported();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, dtype, "dequantize_int8", [&] {
    scalar_t* o = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, groups, kGroupsPerTask, [&](int64_t first, int64_t last) {
      if (wide) {
        dequantize_groups_avx512<scalar_t>(c, s, numel, first, last, o);
      } else {
        dequantize_groups_portable<scalar_t>(c, s, numel, first, last, o);
      }
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mmdropit_cpu, m) {
  m.def("quantize_int8(Tensor flat) -> (Tensor, Tensor)");
  m.def("dequantize_int8(Tensor codes, Tensor scales, ScalarType dtype) -> Tensor");
}

TORCH_LIBRARY_IMPL(mmdropit_cpu, CPU, m) {
  m.impl("quantize_int8", &quantize_int8);
  m.impl("dequantize_int8", &dequantize_int8);
}
