// The 4- and 2-bit codes of saved activations (mmdropit/codecs/low_bit.py), one pass each way
// instead of the eager path's padding, minimum, maximum, subtraction, division, a float of
// random numbers per value from a generator, floor, clamp, conversion and a shift-and-or per
// packed lane (forward), and an unpacking, a float conversion, a multiply and an add (backward):
//
//   quantize_low(flat, bits, seed)     per group of 32 values (the last one padded with its last
//                                      value): minimum, step = range * (1.0f / (2^bits - 1)), codes
//                                      floor((v - min) / step + u), packed 8 / bits to a byte,
//                                      the first in the lowest bits
//   dequantize_low(packed, minimums, steps, bits, numel, dtype)
//                                      code * step + minimum, in dtype
//
// The uniform u of element i is a counter-based hash of (seed, i): the codes depend on the seed
// alone, not on the number of threads, and the caller draws the seed from the plugin's own
// generator. The eager path draws its numbers from that generator directly, so the two paths
// round differently, both without bias. Minimums, steps and dequantized values are computed with
// the eager path's operations in its order (no fused multiply-add), and match it bit for bit;
// the step is a product by the float32 reciprocal of the levels, not a quotient, as in the eager
// path and the Triton kernel (PyTorch divides a CUDA tensor by a number that way).
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

// A uniform number in [0, 1) from the 24 high bits of a hash of the element's index, keyed by
// the seed (murmur3's finaliser over the index mixed with both halves of the key).
__attribute__((always_inline)) inline float uniform_at(int64_t index, uint32_t key_low,
                                                       uint32_t key_high) {
  uint32_t h = (uint32_t(index) * 0x9E3779B1u) ^ key_low;
  h ^= (uint32_t(uint64_t(index) >> 32) * 0x85EBCA77u) + key_high;
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return float(h >> 8) * (1.0f / 16777216.0f);
}

template <typename scalar_t, int kBits>
__attribute__((always_inline)) inline void quantize_groups(
    const scalar_t* x, int64_t numel, int64_t first, int64_t last, uint32_t key_low,
    uint32_t key_high, uint8_t* packed, float* minimums, float* steps) {
  constexpr int kPerByte = 8 / kBits;
  constexpr float kLevels = float((1 << kBits) - 1);
  constexpr float kInverseLevels = 1.0f / kLevels;  // float32(1 / levels), as eager's mul
  for (int64_t group = first; group < last; ++group) {
    const int64_t base = group * kGroup;
    const int64_t count = std::min(kGroup, numel - base);
    float v[kGroup];
    for (int64_t t = 0; t < count; ++t) v[t] = static_cast<float>(x[base + t]);
    for (int64_t t = count; t < kGroup; ++t) v[t] = v[count - 1];
    float low = v[0], high = v[0];
    for (int64_t t = 1; t < kGroup; ++t) {
      low = std::min(low, v[t]);
      high = std::max(high, v[t]);
    }
    const float step = std::max(high - low, std::numeric_limits<float>::min()) * kInverseLevels;
    minimums[group] = low;
    steps[group] = step;
    uint8_t codes[kGroup];
    for (int64_t t = 0; t < kGroup; ++t) {
      const float u = uniform_at(base + t, key_low, key_high);
      const float level = std::floor((v[t] - low) / step + u);
      codes[t] = uint8_t(std::min(std::max(level, 0.0f), kLevels));
    }
    uint8_t* out = packed + group * kGroup / kPerByte;
    for (int64_t b = 0; b < kGroup / kPerByte; ++b) {
      uint8_t byte = 0;
      for (int lane = 0; lane < kPerByte; ++lane) {
        byte |= codes[b * kPerByte + lane] << (kBits * lane);
      }
      out[b] = byte;
    }
  }
}

// The codes of 16 float32 values from index `start` on, a byte each: uniform_at's hash and
// quantize_groups' arithmetic, 16 lanes at a time.
MMDROPIT_CODEC_AVX512 inline __m128i codes_of(__m512 v, int64_t start, __m512 lows,
                                              __m512 step_size, __m512 levels,
                                              uint32_t key_low, __m512i high_mix) {
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i index = _mm512_add_epi32(_mm512_set1_epi32(int(uint32_t(start))), lanes);
  __m512i h = _mm512_xor_si512(_mm512_mullo_epi32(index, _mm512_set1_epi32(int(0x9E3779B1u))),
                               _mm512_set1_epi32(int(key_low)));
  h = _mm512_xor_si512(h, high_mix);
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32(int(0x85EBCA6Bu)));
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 13));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32(int(0xC2B2AE35u)));
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
  const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(h, 8)),
                                 _mm512_set1_ps(1.0f / 16777216.0f));
  __m512 level = _mm512_add_ps(_mm512_div_ps(_mm512_sub_ps(v, lows), step_size), u);
  level = _mm512_roundscale_ps(level, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  level = _mm512_min_ps(_mm512_max_ps(level, _mm512_setzero_ps()), levels);
  return _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(level));
}

// Whole groups of float32 values in AVX-512 registers: the same operations as
// quantize_groups, 16 values at a time, and the codes packed in registers.
template <int kBits>
MMDROPIT_CODEC_AVX512 void quantize_whole_groups_avx512(const float* x, int64_t first,
                                                        int64_t last, uint32_t key_low,
                                                        uint32_t key_high, uint8_t* packed,
                                                        float* minimums, float* steps) {
  constexpr float kLevels = float((1 << kBits) - 1);
  constexpr float kInverseLevels = 1.0f / kLevels;  // float32(1 / levels), as eager's mul
  const __m512 levels = _mm512_set1_ps(kLevels);
  for (int64_t group = first; group < last; ++group) {
    const int64_t base = group * kGroup;
    const __m512 a = _mm512_loadu_ps(x + base), b = _mm512_loadu_ps(x + base + 16);
    const float low = _mm512_reduce_min_ps(_mm512_min_ps(a, b));
    const float high = _mm512_reduce_max_ps(_mm512_max_ps(a, b));
    const float step = std::max(high - low, std::numeric_limits<float>::min()) * kInverseLevels;
    minimums[group] = low;
    steps[group] = step;
    const __m512 lows = _mm512_set1_ps(low), step_size = _mm512_set1_ps(step);
    // a group never crosses a multiple of 2^32: the index's high half is the group's
    const __m512i high_mix =
        _mm512_set1_epi32(int(uint32_t(uint64_t(base) >> 32) * 0x85EBCA77u + key_high));
    const __m256i codes =
        _mm256_set_m128i(codes_of(b, base + 16, lows, step_size, levels, key_low, high_mix),
                         codes_of(a, base, lows, step_size, levels, key_low, high_mix));
    uint8_t* out = packed + group * kGroup * kBits / 8;
    if constexpr (kBits == 4) {  // two codes a 16-bit word -> one byte
      const __m256i pairs = _mm256_or_si256(
          _mm256_and_si256(codes, _mm256_set1_epi16(0x000F)),
          _mm256_and_si256(_mm256_srli_epi16(codes, 4), _mm256_set1_epi16(0x00F0)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_cvtepi16_epi8(pairs));
    } else {  // four codes a 32-bit word -> one byte
      const __m256i mask = _mm256_set1_epi32(0x3);
      __m256i fours = _mm256_and_si256(codes, mask);
      fours = _mm256_or_si256(fours, _mm256_slli_epi32(
          _mm256_and_si256(_mm256_srli_epi32(codes, 8), mask), 2));
      fours = _mm256_or_si256(fours, _mm256_slli_epi32(
          _mm256_and_si256(_mm256_srli_epi32(codes, 16), mask), 4));
      fours = _mm256_or_si256(fours, _mm256_slli_epi32(
          _mm256_and_si256(_mm256_srli_epi32(codes, 24), mask), 6));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(out), _mm256_cvtepi32_epi8(fours));
    }
  }
}

// Other types on AVX-512 machines: the portable loops, vectorised by the compiler.
template <typename scalar_t, int kBits>
MMDROPIT_CODEC_AVX512 void quantize_groups_avx512(const scalar_t* x, int64_t numel,
                                                  int64_t first, int64_t last,
                                                  uint32_t key_low, uint32_t key_high,
                                                  uint8_t* packed, float* minimums,
                                                  float* steps) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    const int64_t whole = std::max(first, std::min(last, numel / kGroup));
    quantize_whole_groups_avx512<kBits>(x, first, whole, key_low, key_high, packed, minimums,
                                        steps);
    first = whole;
  }
  quantize_groups<scalar_t, kBits>(x, numel, first, last, key_low, key_high, packed, minimums,
                                   steps);
}

template <typename scalar_t, int kBits>
void quantize_groups_portable(const scalar_t* x, int64_t numel, int64_t first, int64_t last,
                              uint32_t key_low, uint32_t key_high, uint8_t* packed,
                              float* minimums, float* steps) {
  quantize_groups<scalar_t, kBits>(x, numel, first, last, key_low, key_high, packed, minimums,
                                   steps);
}

template <typename scalar_t, int kBits>
__attribute__((always_inline)) inline void dequantize_groups(
    const uint8_t* packed, const float* minimums, const float* steps, int64_t numel,
    int64_t first, int64_t last, scalar_t* out) {
  constexpr int kPerByte = 8 / kBits;
  constexpr uint8_t kMask = uint8_t((1 << kBits) - 1);
  for (int64_t group = first; group < last; ++group) {
    const int64_t base = group * kGroup;
    const int64_t count = std::min(kGroup, numel - base);
    const uint8_t* in = packed + group * kGroup / kPerByte;
    const float low = minimums[group], step = steps[group];
    for (int64_t t = 0; t < count; ++t) {
      const float code = float((in[t / kPerByte] >> (kBits * (t % kPerByte))) & kMask);
      const float scaled = code * step;  // the eager path multiplies, then adds
      out[base + t] = static_cast<scalar_t>(scaled + low);
    }
  }
}

// 16 codes (32-bit lanes) times the step plus the minimum, stored as float32.
MMDROPIT_CODEC_AVX512 inline void store_rebuilt(__m512i codes, __m512 step, __m512 low,
                                                float* out) {
  const __m512 scaled = _mm512_mul_ps(_mm512_cvtepi32_ps(codes), step);
  _mm512_storeu_ps(out, _mm512_add_ps(scaled, low));  // multiplied, then added, as eager
}

// The 16 two-bit codes of four bytes, each byte given four times in `spread`.
MMDROPIT_CODEC_AVX512 inline __m512i two_bit_codes(__m128i spread) {
  const __m512i shifts = _mm512_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6);
  return _mm512_and_si512(_mm512_srlv_epi32(_mm512_cvtepu8_epi32(spread), shifts),
                          _mm512_set1_epi32(0x3));
}

// Whole groups rebuilt as float32 in AVX-512 registers: the same operations as
// dequantize_groups, the codes unpacked in registers.
template <int kBits>
MMDROPIT_CODEC_AVX512 void dequantize_whole_groups_avx512(const uint8_t* packed,
                                                          const float* minimums,
                                                          const float* steps, int64_t first,
                                                          int64_t last, float* out) {
  for (int64_t group = first; group < last; ++group) {
    const uint8_t* in = packed + group * kGroup * kBits / 8;
    const __m512 step = _mm512_set1_ps(steps[group]), low = _mm512_set1_ps(minimums[group]);
    __m512i first_codes, second_codes;
    if constexpr (kBits == 4) {  // a byte holds codes 2j (low nibble) and 2j + 1
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in));
      const __m128i nibble = _mm_set1_epi8(0x0F);
      const __m128i even = _mm_and_si128(bytes, nibble);
      const __m128i odd = _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble);
      first_codes = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(even, odd));
      second_codes = _mm512_cvtepu8_epi32(_mm_unpackhi_epi8(even, odd));
    } else {  // a byte holds codes 4j .. 4j + 3, the first in the lowest bits
      const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(in));
      first_codes = two_bit_codes(_mm_shuffle_epi8(
          bytes, _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)));
      second_codes = two_bit_codes(_mm_shuffle_epi8(
          bytes, _mm_setr_epi8(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7)));
    }
    store_rebuilt(first_codes, step, low, out + group * kGroup);
    store_rebuilt(second_codes, step, low, out + group * kGroup + 16);
  }
}

template <typename scalar_t, int kBits>
MMDROPIT_CODEC_AVX512 void dequantize_groups_avx512(const uint8_t* packed,
                                                    const float* minimums, const float* steps,
                                                    int64_t numel, int64_t first, int64_t last,
                                                    scalar_t* out) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    const int64_t whole = std::max(first, std::min(last, numel / kGroup));
    dequantize_whole_groups_avx512<kBits>(packed, minimums, steps, first, whole, out);
    first = whole;
  }
  dequantize_groups<scalar_t, kBits>(packed, minimums, steps, numel, first, last, out);
}

template <typename scalar_t, int kBits>
void dequantize_groups_portable(const uint8_t* packed, const float* minimums,
                                const float* steps, int64_t numel, int64_t first, int64_t last,
                                scalar_t* out) {
  dequantize_groups<scalar_t, kBits>(packed, minimums, steps, numel, first, last, out);
}

void check_bits(int64_t bits, const char* name) {
  TORCH_CHECK(bits == 4 || bits == 2, name, ": bits must be 4 or 2, got ", bits);
}

template <int kBits>
void quantize_all(const at::Tensor& flat, int64_t seed, at::Tensor& packed, at::Tensor& minimums,
                  at::Tensor& steps) {
  const int64_t numel = flat.numel(), groups = minimums.numel();
  const uint32_t key_low = uint32_t(uint64_t(seed)), key_high = uint32_t(uint64_t(seed) >> 32);
  uint8_t* p = packed.mutable_data_ptr<uint8_t>();
  float* m = minimums.mutable_data_ptr<float>();
  float* s = steps.mutable_data_ptr<float>();
  const bool wide = mmdropit_avx512::supported();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, flat.scalar_type(), "quantize_low",
                                  [&] {
    const scalar_t* x = flat.const_data_ptr<scalar_t>();
    at::parallel_for(0, groups, kGroupsPerTask, [&](int64_t first, int64_t last) {
      if (wide) {
        quantize_groups_avx512<scalar_t, kBits>(x, numel, first, last, key_low, key_high, p, m,
                                                s);
      } else {
        quantize_groups_portable<scalar_t, kBits>(x, numel, first, last, key_low, key_high, p, m,
                                                  s);
      }
    });
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_low(const at::Tensor& flat, int64_t bits,
                                                            int64_t seed) {
  TORCH_CHECK(flat.dim() == 1 && flat.is_contiguous() && flat.device().is_cpu(),
              "quantize_low: expects a contiguous 1-d CPU tensor");
  check_bits(bits, "quantize_low");
  const int64_t groups = (flat.numel() + kGroup - 1) / kGroup;
  const auto floats = flat.options().dtype(at::kFloat);
  at::Tensor packed = at::empty({groups * kGroup * bits / 8}, flat.options().dtype(at::kByte));
  at::Tensor minimums = at::empty({groups}, floats);
  at::Tensor steps = at::empty({groups}, floats);
  if (groups == 0) return {packed, minimums, steps};
  if (bits == 4) {
    quantize_all<4>(flat, seed, packed, minimums, steps);
  } else {
    quantize_all<2>(flat, seed, packed, minimums, steps);
  }
  return {packed, minimums, steps};
}

template <int kBits>
void dequantize_all(const at::Tensor& packed, const at::Tensor& minimums,
                    const at::Tensor& steps, at::Tensor& out) {
  const int64_t numel = out.numel(), groups = minimums.numel();
  const uint8_t* p = packed.const_data_ptr<uint8_t>();
  const float* m = minimums.const_data_ptr<float>();
  const float* s = steps.const_data_ptr<float>();
  const bool wide = mmdropit_avx512::supported();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, out.scalar_type(), "dequantize_low",
                                  [&] {
    scalar_t* o = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, groups, kGroupsPerTask, [&](int64_t first, int64_t last) {
      if (wide) {
        dequantize_groups_avx512<scalar_t, kBits>(p, m, s, numel, first, last, o);
      } else {
        dequantize_groups_portable<scalar_t, kBits>(p, m, s, numel, first, last, o);
      }
    });
  });
}

at::Tensor dequantize_low(const at::Tensor& packed, const at::Tensor& minimums,
                          const at::Tensor& steps, int64_t bits, int64_t numel,
                          at::ScalarType dtype) {
  check_bits(bits, "dequantize_low");
  const int64_t groups = (numel + kGroup - 1) / kGroup;
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.dim() == 1
                  && packed.numel() == groups * kGroup * bits / 8,
              "dequantize_low: expects ", groups * kGroup * bits / 8, " packed bytes");
  TORCH_CHECK(minimums.scalar_type() == at::kFloat && steps.scalar_type() == at::kFloat
                  && minimums.is_contiguous() && steps.is_contiguous()
                  && minimums.numel() == groups && steps.numel() == groups,
              "dequantize_low: expects a float32 minimum and step per group of ", kGroup);
  at::Tensor out = at::empty({numel}, packed.options().dtype(dtype));
  if (groups == 0) return out;
  if (bits == 4) {
    dequantize_all<4>(packed, minimums, steps, out);
  } else {
    dequantize_all<2>(packed, minimums, steps, out);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mmdropit_cpu, m) {
  m.def("quantize_low(Tensor flat, int bits, int seed) -> (Tensor, Tensor, Tensor)");
  m.def("dequantize_low(Tensor packed, Tensor minimums, Tensor steps, int bits, int numel, "
        "ScalarType dtype) -> Tensor");
}

TORCH_LIBRARY_IMPL(mmdropit_cpu, CPU, m) {
  m.impl("quantize_low", &quantize_low);
  m.impl("dequantize_low", &dequantize_low);
}
