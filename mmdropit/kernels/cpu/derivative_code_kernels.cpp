// The 4-bit derivative codes of the lean GELU / SiLU (mmdropit/codecs/derivative_codes.py), one
// pass each instead of a bucketize, a cast, a pad and a shift-and-or packing (forward) and an
// unpacking, a cast, a table lookup and a multiply (backward):
//
//   bucket_codes(flat, boundaries)       code i = how many boundaries lie below x_i (what
//                                        torch.bucketize gives for ascending boundaries; a NaN
//                                        after all of them), two a byte, element 2k in the low
//                                        four bits of byte k
//   scale_by_codes(grad, packed, table)  grad_i * table[code i], in grad's dtype
//
// `boundaries` come in the input's dtype and `table` in the gradient's (as the eager path casts
// them), so a comparison and a product round as PyTorch's do.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <cstdint>

#include "chunks.h"

namespace {

using mmdropit_chunks::Chunks;
using mmdropit_chunks::chunks_of;
using mmdropit_chunks::for_each_chunk;

constexpr int64_t kLevels = 16;  // 4-bit codes

// The boundaries not at or above x: those below it, and all of them for a NaN (as
// torch.bucketize places a NaN last).
template <typename scalar_t>
inline uint32_t code_of(scalar_t x, const scalar_t* boundaries, int64_t count) {
  uint32_t code = 0;
  for (int64_t b = 0; b < count; ++b) code += !(x <= boundaries[b]);
  return code;
}

at::Tensor bucket_codes(const at::Tensor& flat, const at::Tensor& boundaries) {
  TORCH_CHECK(flat.dim() == 1 && flat.is_contiguous() && flat.device().is_cpu(),
              "bucket_codes: expects a contiguous 1-d CPU tensor");
  TORCH_CHECK(boundaries.dim() == 1 && boundaries.numel() < kLevels
                  && boundaries.scalar_type() == flat.scalar_type(),
              "bucket_codes: expects fewer than 16 boundaries in the input's dtype");
  const int64_t numel = flat.numel();
  at::Tensor packed = at::empty({(numel + 1) / 2}, flat.options().dtype(at::kByte));
  if (numel == 0) return packed;
  const at::Tensor bounds = boundaries.contiguous();
  const Chunks chunks = chunks_of(numel);  // chunks of a multiple of 64: whole bytes
  uint8_t* out = packed.mutable_data_ptr<uint8_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, flat.scalar_type(), "bucket_codes",
                                  [&] {
    const scalar_t* x = flat.const_data_ptr<scalar_t>();
    const scalar_t* b = bounds.const_data_ptr<scalar_t>();
    const int64_t count = bounds.numel();
    for_each_chunk(chunks, [&](int64_t, int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; i += 2) {
        uint32_t byte = code_of(x[i], b, count);
        if (i + 1 < end) byte |= code_of(x[i + 1], b, count) << 4;
        out[i / 2] = uint8_t(byte);
      }
    });
  });
  return packed;
}

at::Tensor scale_by_codes(const at::Tensor& grad, const at::Tensor& packed,
                          const at::Tensor& table) {
  TORCH_CHECK(grad.dim() == 1 && grad.is_contiguous() && grad.device().is_cpu(),
              "scale_by_codes: expects a contiguous 1-d CPU tensor");
  const int64_t numel = grad.numel();
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous()
                  && packed.numel() == (numel + 1) / 2,
              "scale_by_codes: expects ceil(numel / 2) packed bytes");
  TORCH_CHECK(table.dim() == 1 && table.numel() == kLevels
                  && table.scalar_type() == grad.scalar_type(),
              "scale_by_codes: expects a table of 16 values in the gradient's dtype");
  at::Tensor out = at::empty_like(grad);
  if (numel == 0) return out;
  const at::Tensor values = table.contiguous();
  const Chunks chunks = chunks_of(numel);
  const uint8_t* codes = packed.const_data_ptr<uint8_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, grad.scalar_type(),
                                  "scale_by_codes", [&] {
    const scalar_t* g = grad.const_data_ptr<scalar_t>();
    const scalar_t* t = values.const_data_ptr<scalar_t>();
    scalar_t* o = out.mutable_data_ptr<scalar_t>();
    for_each_chunk(chunks, [&](int64_t, int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        o[i] = g[i] * t[(codes[i / 2] >> (4 * (i % 2))) & 15];
      }
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mmdropit_cpu, m) {
  m.def("bucket_codes(Tensor flat, Tensor boundaries) -> Tensor");
  m.def("scale_by_codes(Tensor grad, Tensor packed, Tensor table) -> Tensor");
}

TORCH_LIBRARY_IMPL(mmdropit_cpu, CPU, m) {
  m.impl("bucket_codes", &bucket_codes);
  m.impl("scale_by_codes", &scale_by_codes);
}
