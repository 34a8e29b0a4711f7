// DropIT's convolution as one C++ autograd node (operator mmdropit_cpu::dropit_conv).
//
// What mmdropit/dropit/functional.py's DropITConvFunction does for a contiguous input with
// symmetric padding, without Python between the operators:
//
//   forward    the kept elements of the input: keep_topk's bitmask + values (the fused `mink`),
//              keep_random's where it is given a generator (the fused `random`), or the
//              encoded selection it is given (`first` + `values`: another strategy's or
//              encoding, selected by the layer), saved with the weight; the output of
//              at::convolution (N-d, not transposed).
//   backward   at::convolution_backward for the gradients autograd needs: first the weight's
//              (and the bias's) from the dense input rebuilt by scatter_kept, then, in a call
//              of its own, the input's exact (an expanded one-element tensor of the input's
//              shape stands in for it: only its shape is read), so the rebuilt input and the
//              input's gradient never take memory together.
//
// The same operators in the same order as the Python Function, so the outputs and gradients are
// bit-identical to it; the selections and scatter_bitmask are called through the dispatcher
// (dispatched_ops.h), so the node runs on every device that registers them.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <array>
#include <optional>
#include <tuple>
#include <vector>

#include "dispatched_ops.h"

namespace mmdropit {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// grad_fn: torch::autograd::CppNode<mmdropit::DropITConvNode>
struct DropITConvNode : public torch::autograd::Function<DropITConvNode> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                            at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                            int64_t kept, const std::optional<at::Tensor>& first,
                            const std::optional<at::Tensor>& values,
                            const std::optional<at::Generator>& generator) {
    auto [saved_first, saved_values] =
        mmdropit_dispatched::node_selection(x, kept, first, values, generator);
    ctx->save_for_backward({weight, saved_first, saved_values});
    // one saved list (each saved value costs host time): groups, whether there is a bias,
    // then stride, padding, dilation and the input's sizes
    std::vector<int64_t> geometry{groups, bias.has_value() && bias->defined()};
    for (const at::IntArrayRef part : {stride, padding, dilation, x.sizes()}) {
      geometry.insert(geometry.end(), part.begin(), part.end());
    }
    ctx->saved_data["geometry"] = std::move(geometry);
    const std::vector<int64_t> output_padding(stride.size(), 0);
    return at::convolution(x, weight, bias, stride, padding, dilation, false, output_padding,
                           groups);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& weight = saved[0];
    const at::Tensor& grad_out = grads[0];
    const std::vector<int64_t> geometry = ctx->saved_data["geometry"].toIntVector();
    const int64_t spatial = weight.dim() - 2;
    const at::IntArrayRef all(geometry);
    const at::IntArrayRef stride = all.slice(2, spatial), padding = all.slice(2 + spatial, spatial),
                          dilation = all.slice(2 + 2 * spatial, spatial),
                          sizes = all.slice(2 + 3 * spatial);
    const bool need_input = ctx->needs_input_grad(0), need_weight = ctx->needs_input_grad(1);
    const bool need_bias = geometry[1] != 0 && ctx->needs_input_grad(2);
    const std::vector<int64_t> bias_size{weight.size(0)};
    const at::OptionalIntArrayRef bias_sizes =
        geometry[1] != 0 ? at::OptionalIntArrayRef(bias_size) : at::OptionalIntArrayRef();
    const std::vector<int64_t> output_padding(stride.size(), 0);
    const auto gradients = [&](const at::Tensor& x, std::array<bool, 3> mask) {
      return at::convolution_backward(grad_out, x, weight, bias_sizes, stride, padding, dilation,
                                      false, output_padding, geometry[0], mask);
    };
    at::Tensor grad_input, grad_weight, grad_bias;
    if (need_weight) {  // first, alone: the rebuilt input is freed before grad_input exists
      const int64_t numel = c10::multiply_integers(sizes);
      std::tie(std::ignore, grad_weight, grad_bias) = gradients(
          mmdropit_dispatched::scatter_kept(saved[1], saved[2], numel).view(sizes),
          {false, true, need_bias});
    }
    if (need_input || (need_bias && !need_weight)) {
      // only the input's shape is read, as in torch.nn.grad.conv2d_input
      at::Tensor bias_grad;
      std::tie(grad_input, std::ignore, bias_grad) = gradients(
          grad_out.new_empty({1}).expand(sizes), {need_input, false, need_bias && !need_weight});
      if (!need_weight) grad_bias = bias_grad;
    }
    return {grad_input, grad_weight, grad_bias, at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace mmdropit

namespace {

at::Tensor dropit_conv(const at::Tensor& x, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                       at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                       int64_t kept, const std::optional<at::Tensor>& first,
                       const std::optional<at::Tensor>& values,
                       const std::optional<at::Generator>& generator) {
  return mmdropit::DropITConvNode::apply(x, weight, bias, stride, padding, dilation, groups,
                                         kept, first, values, generator);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mmdropit_cpu, m) {
  m.def("dropit_conv(Tensor x, Tensor weight, Tensor? bias, int[] stride, int[] padding, "
        "int[] dilation, int groups, int kept, Tensor? first=None, Tensor? values=None, "
        "Generator? generator=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(mmdropit_cpu, CompositeImplicitAutograd, m) {
  m.impl("dropit_conv", &dropit_conv);
}
