// The library's operators as its C++ autograd nodes call them: through the dispatcher, so a node
// runs on every device that registers them (the CPU kernels of dropit_kernels.cpp and
// lean_mask_kernels.cpp; on a GPU the Triton kernels, mmdropit/kernels/cuda/nodes.py).
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <optional>
#include <tuple>

namespace mmdropit_dispatched {

// The `kept` largest-magnitude elements of the contiguous 1-d `flat`: (bitmask, values).
inline std::tuple<at::Tensor, at::Tensor> keep_topk(const at::Tensor& flat, int64_t kept) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("mmdropit_cpu::keep_topk", "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, int64_t,
                                                                 bool)>();
  return op.call(flat, kept, true);
}

// `random`'s `kept` elements of the contiguous 1-d `flat`, keyed by one draw from `generator`,
// times numel / kept: (bitmask, values).
inline std::tuple<at::Tensor, at::Tensor> keep_random(const at::Tensor& flat, int64_t kept,
                                                      const at::Generator& generator) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("mmdropit_cpu::keep_random", "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(
                           const at::Tensor&, int64_t, bool, double,
                           std::optional<at::Generator>)>();
  const double scale = double(flat.numel()) / double(std::max<int64_t>(kept, 1));
  return op.call(flat, kept, true, scale, generator);
}

// What a DropIT node saves of its contiguous input `x`: the encoded selection it is given
// (`first` + `values`), else its own in the bitmask encoding: `random`'s where it is given a
// generator, else `mink`'s.
inline std::tuple<at::Tensor, at::Tensor> node_selection(
    const at::Tensor& x, int64_t kept, const std::optional<at::Tensor>& first,
    const std::optional<at::Tensor>& values, const std::optional<at::Generator>& generator) {
  if (first.has_value() && first->defined()) return {*first, *values};
  if (generator.has_value() && generator->defined()) {
    return keep_random(x.view(-1), kept, *generator);
  }
  return keep_topk(x.view(-1), kept);
}

// The flat dense tensor of `numel` elements: `values` where a bit is set, zero elsewhere.
inline at::Tensor scatter_bitmask(const at::Tensor& bits, const at::Tensor& values,
                                  int64_t numel) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("mmdropit_cpu::scatter_bitmask", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t)>();
  return op.call(bits, values, numel);
}

// The flat dense tensor of `numel` elements that a selection encoded (dropped elements zero):
// `values` where a bit of the uint8 bitmask `first` is set, or at the int32 / int64 indices
// `first` (as mmdropit/dropit/compact.py's scatter_kept rebuilds it).
inline at::Tensor scatter_kept(const at::Tensor& first, const at::Tensor& values, int64_t numel) {
  if (first.scalar_type() == at::kByte) return scatter_bitmask(first, values, numel);
  return at::zeros({numel}, values.options()).index_copy_(0, first.to(at::kLong), values);
}

// One bit an element of the contiguous 1-d `flat`: low < x, and x < high where `bounded`.
inline at::Tensor pack_between(const at::Tensor& flat, double low, double high, bool bounded) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("mmdropit_cpu::pack_between", "")
                       .typed<at::Tensor(const at::Tensor&, double, double, bool)>();
  return op.call(flat, low, high, bounded);
}

// The contiguous 1-d `grad` where a bit of `bits` is set, zero elsewhere.
inline at::Tensor where_bits(const at::Tensor& grad, const at::Tensor& bits) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("mmdropit_cpu::where_bits", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  return op.call(grad, bits);
}

}  // namespace mmdropit_dispatched
