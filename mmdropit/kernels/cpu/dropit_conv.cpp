// DropIT's convolution as one C++ autograd node (operator mmdropit_cpu::dropit_conv).
//
// What mmdropit/dropit/functional.py's DropITConvFunction does for a contiguous input with the
// fused `mink` selection in the bitmask encoding and symmetric padding, without Python between
// the operators:
//
//   forward    keep_topk (the kept elements of the input as bitmask + values), saved with the
//              weight; the output of at::convolution (N-d, not transposed).
//   backward   one at::convolution_backward for the gradients autograd needs: the input's and
//              the bias's exact, the weight's from the dense input rebuilt by scatter_bitmask
//              (where the weight needs none, an expanded one-element tensor of the input's
//              shape stands in: only its shape is read).
//
// The same operators in the same order as the Python Function, so the outputs and gradients are
// bit-identical to it; keep_topk and scatter_bitmask are called through the dispatcher
// (selection_ops.h), so the node runs on every device that registers them.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <array>
#include <optional>
#include <vector>

#include "selection_ops.h"

namespace mmdropit {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// grad_fn: torch::autograd::CppNode<mmdropit::DropITConvNode>
struct DropITConvNode : public torch::autograd::Function<DropITConvNode> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                            at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                            int64_t kept) {
    auto [bits, values] = mmdropit_selection::keep_topk(x.view(-1), kept);
    ctx->save_for_backward({weight, bits, values});
    ctx->saved_data["sizes"] = x.sizes().vec();
    ctx->saved_data["stride"] = stride.vec();
    ctx->saved_data["padding"] = padding.vec();
    ctx->saved_data["dilation"] = dilation.vec();
    ctx->saved_data["groups"] = groups;
    ctx->saved_data["bias"] = bias.has_value() && bias->defined();
    const std::vector<int64_t> output_padding(stride.size(), 0);
    return at::convolution(x, weight, bias, stride, padding, dilation, false, output_padding,
                           groups);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& weight = saved[0];
    const at::Tensor& grad_out = grads[0];
    const std::vector<int64_t> sizes = ctx->saved_data["sizes"].toIntVector();
    const std::vector<int64_t> stride = ctx->saved_data["stride"].toIntVector();
    const bool need_weight = ctx->needs_input_grad(1);
    const bool has_bias = ctx->saved_data["bias"].toBool();
    at::Tensor x;
    if (need_weight) {
      const int64_t numel = c10::multiply_integers(sizes);
      x = mmdropit_selection::scatter_bitmask(saved[1], saved[2], numel).view(sizes);
    } else {  // only the shape is read, as in torch.nn.grad.conv2d_input
      x = grad_out.new_empty({1}).expand(sizes);
    }
    const std::vector<int64_t> bias_size{weight.size(0)};
    const at::OptionalIntArrayRef bias_sizes =
        has_bias ? at::OptionalIntArrayRef(bias_size) : at::OptionalIntArrayRef();
    const std::vector<int64_t> output_padding(stride.size(), 0);
    auto [grad_input, grad_weight, grad_bias] = at::convolution_backward(
        grad_out, x, weight, bias_sizes, stride, ctx->saved_data["padding"].toIntVector(),
        ctx->saved_data["dilation"].toIntVector(), false, output_padding,
        ctx->saved_data["groups"].toInt(),
        {ctx->needs_input_grad(0), need_weight, has_bias && ctx->needs_input_grad(2)});
    return {grad_input, grad_weight, grad_bias, at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

}  // namespace mmdropit

namespace {

at::Tensor dropit_conv(const at::Tensor& x, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                       at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                       int64_t kept) {
  return mmdropit::DropITConvNode::apply(x, weight, bias, stride, padding, dilation, groups,
                                         kept);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mmdropit_cpu, m) {
  m.def("dropit_conv(Tensor x, Tensor weight, Tensor? bias, int[] stride, int[] padding, "
        "int[] dilation, int groups, int kept) -> Tensor");
}

TORCH_LIBRARY_IMPL(mmdropit_cpu, CompositeImplicitAutograd, m) {
  m.impl("dropit_conv", &dropit_conv);
}
