// What the codec kernels (int8_kernels.cpp, low_bit_kernels.cpp) share: the group of values
// that share their parameters, as in mmdropit/codecs/int8.py, and how many groups a thread
// takes at a time. Their AVX-512 forms are compiled with MMDROPIT_CODEC_AVX512 and chosen at run
// time (mmdropit_avx512::supported()).
#pragma once

#include <cstdint>

namespace mmdropit_codecs {

constexpr int64_t kGroup = 32;            // values sharing a scale, or a minimum and a step
constexpr int64_t kGroupsPerTask = 2048;  // groups a thread takes at a time

}  // namespace mmdropit_codecs

#define MMDROPIT_CODEC_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
