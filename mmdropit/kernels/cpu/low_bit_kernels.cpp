// The 4- and 2-bit codes of saved activations (mmdropit/codecs/low_bit.py), one pass each way
// instead of the eager path's padding, minimum, maximum, subtraction, division, a float of
// random numbers per value from a generator, floor, clamp, conversion and a shift-and-or per
// packed lane (forward), and an unpacking, a float conversion, a multiply and an add (backward):
//
//   quantize_low(flat, bits, seed)     per group of 32 values (the last one padded with its last
//                                      value): minimum, step = range / (2^bits - 1), codes
//                                      floor((v - min) / step + u), packed 8 / bits to a byte,
//                                      the first in the lowest bits
//   dequantize_low(packed, minimums, steps, bits, numel, dtype)
//                                      code * step + minimum, in dtype
//
// The uniform u of element i is a counter-based hash of (seed, i): the codes depend on the seed
// alone, not on the number of threads, and the caller draws the seed from the plugin's own
// generator. The eager path draws its numbers from that generator directly, so the two paths
// round differently, both without bias. Minimums, steps and dequantized values are computed with
// the eager path's operations in its order (no fused multiply-add), and match it bit for bit.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "avx512_paths.h"

namespace {

#define MMDROPIT_LOW_BIT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

constexpr int64_t kGroup = 32;          // values sharing a minimum and a step (codecs/int8.py)
constexpr int64_t kGroupsPerTask = 2048;  // groups a thread takes at a time

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
    const float step = std::max(high - low, std::numeric_limits<float>::min()) / kLevels;
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

// The same loops compiled for AVX-512 (vectorised by the compiler), chosen at run time.
template <typename scalar_t, int kBits>
MMDROPIT_LOW_BIT_AVX512 void quantize_groups_avx512(const scalar_t* x, int64_t numel,
                                                    int64_t first, int64_t last,
                                                    uint32_t key_low, uint32_t key_high,
                                                    uint8_t* packed, float* minimums,
                                                    float* steps) {
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

template <typename scalar_t, int kBits>
MMDROPIT_LOW_BIT_AVX512 void dequantize_groups_avx512(const uint8_t* packed,
                                                      const float* minimums, const float* steps,
                                                      int64_t numel, int64_t first, int64_t last,
                                                      scalar_t* out) {
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

#undef MMDROPIT_LOW_BIT_AVX512

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
