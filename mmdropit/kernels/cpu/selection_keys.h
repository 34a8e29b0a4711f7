// The keys DropIT's selections keep the largest of, by element index: the magnitudes' bit
// patterns (mink, mink_approx) or counter-based random numbers (random). Every pass of
// threshold_search.h and dropit_kernels.cpp reads its keys through one of these.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "avx512_paths.h"

namespace mmdropit_select {

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

// Whether a key source has an AVX-512 form (avx512_paths.h; lanes_of gives it): float32
// magnitudes and random's keys do; the others run the portable loops.
template <typename Keys>
constexpr bool kHasLanes =
    std::is_same_v<Keys, MagnitudeKeys<float>> || std::is_same_v<Keys, DrawnKeys>;

inline mmdropit_avx512::MagnitudeLanes lanes_of(const MagnitudeKeys<float>& keys) {
  return {keys.data};
}

inline mmdropit_avx512::DrawnLanes lanes_of(const DrawnKeys& keys) { return {keys.seed}; }

}  // namespace mmdropit_select
