// DropIT's selection operators as the C++ autograd nodes call them: through the dispatcher, so a
// node runs on every device that registers mmdropit_cpu::keep_topk and scatter_bitmask (the CPU
// kernels of dropit_kernels.cpp; on a GPU the Triton kernels, mmdropit/kernels/cuda/nodes.py).
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <tuple>

namespace mmdropit_selection {

// The `kept` largest-magnitude elements of the contiguous 1-d `flat`: (bitmask, values).
inline std::tuple<at::Tensor, at::Tensor> keep_topk(const at::Tensor& flat, int64_t kept) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("mmdropit_cpu::keep_topk", "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, int64_t,
                                                                 bool)>();
  return op.call(flat, kept, true);
}

// The flat dense tensor of `numel` elements: `values` where a bit is set, zero elsewhere.
inline at::Tensor scatter_bitmask(const at::Tensor& bits, const at::Tensor& values,
                                  int64_t numel) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("mmdropit_cpu::scatter_bitmask", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t)>();
  return op.call(bits, values, numel);
}

}  // namespace mmdropit_selection
