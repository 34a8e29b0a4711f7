// AVX-512 forms of the fused kernels' passes over float32 data (dropit_kernels.cpp calls them
// when the CPU has AVX-512 F/BW/VL/DQ; otherwise its portable loops run). Each handles one
// chunk, 16 elements a step, the last step masked. Kept values are compressed in registers and
// written through a small staging buffer: compressing straight to memory is microcoded and slow
// on some CPUs, and a full-width store past the chunk's values would race with the next chunk.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace mmdropit_avx512 {

#define MMDROPIT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,popcnt")))

// True when the CPU has what these forms use, unless MMDROPIT_NO_AVX512=1 asks for the portable
// loops (read once per process; the tests compare both).
inline bool supported() {
  static const bool yes = [] {
    const char* portable = std::getenv("MMDROPIT_NO_AVX512");
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
        && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")
        && !(portable != nullptr && std::string(portable) == "1");
  }();
  return yes;
}

MMDROPIT_AVX512 inline __mmask16 step_mask(int64_t i, int64_t end) {
  const int64_t n = end - i;
  return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
}

MMDROPIT_AVX512 inline __m512i keys_at(const float* data, int64_t i, __mmask16 valid) {
  return _mm512_and_si512(_mm512_maskz_loadu_epi32(valid, data + i),
                          _mm512_set1_epi32(0x7fffffff));
}

// The keys of 16 elements from i on, as the passes below read them. MagnitudeLanes: the bit
// patterns of |x| of float32 data (mink); DrawnLanes: `random`'s keys (selection_keys.h's
// DrawnKeys: the top 30 bits of SplitMix64 of seed + (index + 1) * golden), eight 64-bit
// lanes at a time. Lanes past the end are left to the callers' masks.
struct MagnitudeLanes {
  const float* data;
  MMDROPIT_AVX512 __m512i keys(int64_t i, __mmask16 valid) const {
    return keys_at(data, i, valid);
  }
};

MMDROPIT_AVX512 inline __m256i drawn_keys8(uint64_t seed, int64_t first) {
  const __m512i index = _mm512_add_epi64(_mm512_set1_epi64(first + 1),
                                         _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7));
  __m512i z = _mm512_add_epi64(_mm512_set1_epi64(int64_t(seed)),
                               _mm512_mullo_epi64(index, _mm512_set1_epi64(0x9E3779B97F4A7C15)));
  z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 30)),
                         _mm512_set1_epi64(int64_t(0xBF58476D1CE4E5B9ull)));
  z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 27)),
                         _mm512_set1_epi64(int64_t(0x94D049BB133111EBull)));
  z = _mm512_xor_si512(z, _mm512_srli_epi64(z, 31));
  return _mm512_cvtepi64_epi32(_mm512_srli_epi64(z, 34));
}

struct DrawnLanes {
  uint64_t seed;
  MMDROPIT_AVX512 __m512i keys(int64_t i, __mmask16) const {
    return _mm512_inserti64x4(_mm512_castsi256_si512(drawn_keys8(seed, i)),
                              drawn_keys8(seed, i + 8), 1);
  }
};

// Keys at or below `low` are counted, above `high` counted, in between collected into `band`.
template <typename Lanes>
MMDROPIT_AVX512 inline void bracket(const Lanes& lanes, int64_t begin, int64_t end, uint32_t low,
                                    uint32_t high, int64_t& below, int64_t& above,
                                    std::vector<uint32_t>& band) {
  const __m512i lo = _mm512_set1_epi32(int32_t(low)), hi = _mm512_set1_epi32(int32_t(high));
  constexpr int kStage = 1024;
  alignas(64) uint32_t staged[kStage + 16];
  int pos = 0;
  int64_t n_below = 0, n_above = 0;
  for (int64_t i = begin; i < end; i += 16) {
    const __mmask16 valid = step_mask(i, end);
    const __m512i key = lanes.keys(i, valid);
    const __mmask16 at_or_below = _mm512_mask_cmple_epu32_mask(valid, key, lo);
    const __mmask16 over = _mm512_mask_cmpgt_epu32_mask(valid, key, hi);
    const __mmask16 inside = valid & ~at_or_below & ~over;
    n_below += _mm_popcnt_u32(at_or_below);
    n_above += _mm_popcnt_u32(over);
    if (inside) {
      _mm512_storeu_si512(staged + pos, _mm512_maskz_compress_epi32(inside, key));
      pos += _mm_popcnt_u32(inside);
      if (pos >= kStage) {
        band.insert(band.end(), staged, staged + pos);
        pos = 0;
      }
    }
  }
  band.insert(band.end(), staged, staged + pos);
  below = n_below;
  above = n_above;
}

// How many keys lie above `threshold` and how many equal it.
template <typename Lanes>
MMDROPIT_AVX512 inline void count_around(const Lanes& lanes, int64_t begin, int64_t end,
                                         int64_t threshold, int64_t& above, int64_t& equal) {
  const __m512i t = _mm512_set1_epi32(int32_t(threshold));
  int64_t n_above = 0, n_equal = 0;
  for (int64_t i = begin; i < end; i += 16) {
    const __mmask16 valid = step_mask(i, end);
    const __m512i key = lanes.keys(i, valid);
    n_above += _mm_popcnt_u32(_mm512_mask_cmpgt_epi32_mask(valid, key, t));
    n_equal += _mm_popcnt_u32(_mm512_mask_cmpeq_epi32_mask(valid, key, t));
  }
  above = n_above;
  equal = n_equal;
}

// Keeps keys above `threshold` (-1: all) and the first `ties` equal to it; writes the bitmask
// bytes of [begin, end) and/or int32 indices, and the kept values of `data` (times `scale`
// where it is not 1) from `values` on.
template <typename Lanes>
MMDROPIT_AVX512 inline void write_kept(const float* data, const Lanes& lanes, int64_t begin,
                                       int64_t end, int64_t threshold, int64_t ties,
                                       float scale, uint8_t* bitmask, int32_t* indices,
                                       float* values) {
  const __m512i t = _mm512_set1_epi32(int32_t(threshold));
  const __m512i steps = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  constexpr int kStage = 1024;
  alignas(64) float staged[kStage + 16];
  alignas(64) int32_t staged_index[kStage + 16];
  int pos = 0;
  for (int64_t i = begin; i < end; i += 16) {
    const __mmask16 valid = step_mask(i, end);
    const __m512i raw = _mm512_maskz_loadu_epi32(valid, data + i);
    const __m512i key = lanes.keys(i, valid);
    uint32_t keep = _mm512_mask_cmpgt_epi32_mask(valid, key, t);
    uint32_t equal = _mm512_mask_cmpeq_epi32_mask(valid, key, t);
    for (; equal != 0 && ties > 0; equal &= equal - 1, --ties) keep |= 1u << __builtin_ctz(equal);
    if (bitmask != nullptr) {
      bitmask[i / 8] = uint8_t(keep);
      if (end - i > 8) bitmask[i / 8 + 1] = uint8_t(keep >> 8);
    }
    __m512 kept_values = _mm512_castsi512_ps(raw);
    if (scale != 1.0f) kept_values = _mm512_mul_ps(kept_values, _mm512_set1_ps(scale));
    _mm512_storeu_ps(staged + pos, _mm512_maskz_compress_ps(__mmask16(keep), kept_values));
    if (indices != nullptr) {
      const __m512i index = _mm512_add_epi32(steps, _mm512_set1_epi32(int32_t(i)));
      _mm512_storeu_si512(staged_index + pos, _mm512_maskz_compress_epi32(__mmask16(keep), index));
    }
    pos += _mm_popcnt_u32(keep);
    if (pos >= kStage || i + 16 >= end) {
      std::memcpy(values, staged, pos * sizeof(float));
      values += pos;
      if (indices != nullptr) {
        std::memcpy(indices, staged_index, pos * sizeof(int32_t));
        indices += pos;
      }
      pos = 0;
    }
  }
}

// The dense elements [begin, end) from the bitmask and the chunk's kept values.
MMDROPIT_AVX512 inline void scatter_bitmask(const uint8_t* bits, const float* values,
                                            int64_t begin, int64_t end, float* dense) {
  for (int64_t i = begin; i < end; i += 16) {
    const __mmask16 valid = step_mask(i, end);
    uint32_t mask = bits[i / 8];
    if (end - i > 8) mask |= uint32_t(bits[i / 8 + 1]) << 8;
    mask &= valid;
    const int count = _mm_popcnt_u32(mask);
    const __m512 packed = _mm512_maskz_loadu_ps(__mmask16((1u << count) - 1), values);
    _mm512_mask_storeu_ps(dense + i, valid, _mm512_maskz_expand_ps(__mmask16(mask), packed));
    values += count;
  }
}

#undef MMDROPIT_AVX512

}  // namespace mmdropit_avx512
