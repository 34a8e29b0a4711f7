// DropIT's Linear as one C++ autograd node (operator mmdropit_cpu::dropit_linear).
//
// What mmdropit/dropit/functional.py's DropITLinearFunction does for a contiguous input, without
// Python between the operators:
//
//   forward    the kept elements of the input: keep_topk's bitmask + values (the fused `mink`),
//              keep_random's where it is given a generator (the fused `random`), or the
//              encoded selection it is given (`first` + `values`: another strategy's or
//              encoding, selected by the layer), saved with the weight; the output as F.linear
//              computes it, as a tensor of its own (not a view: a custom node's output may then
//              be changed in place, as DETR's heads do).
//   backward   weight gradient grad_out^T @ the dense input rebuilt by scatter_kept, then
//              input gradient grad_out @ weight (exact; the rebuilt input is freed by then, so
//              the two never take memory together), bias gradient the sum of grad_out over rows
//              (exact); each only when autograd needs it.
//
// The same operators in the same order as the Python Function, so the outputs and gradients are
// bit-identical to it. The selections and scatter_bitmask are called through the dispatcher, so
// the node runs on any device that registers them (dispatched_ops.h). A Python autograd Function
// costs a host-bound GPU step its context, its Python backward node and the Python between the
// operators, every layer, every step (docs/dropit.md, "Host time a layer adds").
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <optional>

#include "dispatched_ops.h"

namespace {

using mmdropit_dispatched::node_selection;
using mmdropit_dispatched::scatter_kept;
using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// F.linear(x, weight, bias); for inputs of more than two dimensions written into a tensor of
// its own, where F.linear returns a view of a 2-d product.
at::Tensor linear_not_a_view(const at::Tensor& x, const at::Tensor& weight,
                             const std::optional<at::Tensor>& bias) {
  if (x.dim() <= 2) return at::linear(x, weight, bias);
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = weight.size(0);
  at::Tensor out = at::empty(sizes, x.options());
  at::Tensor rows = out.view({-1, weight.size(0)});
  at::Tensor flat = x.reshape({-1, x.size(-1)});
  if (bias.has_value() && bias->defined()) {
    at::addmm_out(rows, *bias, flat, weight.t());
  } else {
    at::mm_out(rows, flat, weight.t());
  }
  return out;
}

}  // namespace

namespace mmdropit {

// grad_fn: torch::autograd::CppNode<mmdropit::DropITLinearNode>
struct DropITLinearNode : public torch::autograd::Function<DropITLinearNode> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, int64_t kept,
                            const std::optional<at::Tensor>& first,
                            const std::optional<at::Tensor>& values,
                            const std::optional<at::Generator>& generator) {
    auto [saved_first, saved_values] = node_selection(x, kept, first, values, generator);
    ctx->save_for_backward({weight, saved_first, saved_values});
    ctx->saved_data["numel"] = x.numel();
    ctx->saved_data["features"] = x.dim() ? x.size(-1) : int64_t(1);
    ctx->saved_data["bias"] = bias.has_value() && bias->defined();
    return linear_not_a_view(x, weight, bias);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& weight = saved[0];
    const at::Tensor& grad_out = grads[0];
    const bool matrix = grad_out.dim() == 2;  // a batch of rows: no reshaping
    at::Tensor grad_input, grad_weight, grad_bias;
    const at::Tensor flat_grad = matrix ? grad_out : grad_out.reshape({-1, grad_out.size(-1)});
    if (ctx->needs_input_grad(1)) {  // first: the rebuilt input is freed before grad_input exists
      const int64_t numel = ctx->saved_data["numel"].toInt();
      const int64_t features = ctx->saved_data["features"].toInt();
      grad_weight = flat_grad.t().mm(scatter_kept(saved[1], saved[2], numel)
                                         .view({-1, features}));
    }
    if (ctx->needs_input_grad(0)) {
      grad_input = matrix ? grad_out.mm(weight) : grad_out.matmul(weight);
    }
    if (ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2)) {
      grad_bias = flat_grad.sum(0);
    }
    return {grad_input, grad_weight, grad_bias, at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace mmdropit

namespace {

at::Tensor dropit_linear(const at::Tensor& x, const at::Tensor& weight,
                         const std::optional<at::Tensor>& bias, int64_t kept,
                         const std::optional<at::Tensor>& first,
                         const std::optional<at::Tensor>& values,
                         const std::optional<at::Generator>& generator) {
  return mmdropit::DropITLinearNode::apply(x, weight, bias, kept, first, values, generator);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mmdropit_cpu, m) {
  m.def("dropit_linear(Tensor x, Tensor weight, Tensor? bias, int kept, Tensor? first=None, "
        "Tensor? values=None, Generator? generator=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(mmdropit_cpu, CompositeImplicitAutograd, m) {
  m.impl("dropit_linear", &dropit_linear);
}
