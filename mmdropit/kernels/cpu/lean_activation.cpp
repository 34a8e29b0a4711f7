// The lean ReLU and Hardtanh as one C++ autograd node (operators mmdropit_cpu::lean_relu,
// lean_relu_, lean_hardtanh, lean_hardtanh_; the underscore: in place).
//
// What mmdropit/dropit/lean_activations.py's _LeanActivationFunction does for a contiguous
// input, without Python between the operators:
//
//   forward    pack_between (1 bit an element: where the gradient passes, low < x, and x < high
//              for Hardtanh), then the activation itself (in place where asked); the bits saved.
//   backward   where_bits: the output gradient where a bit is set, zero elsewhere.
//
// The same operators in the same order as the Python Function, so outputs and gradients are
// bit-identical to it. pack_between and where_bits are called through the dispatcher, so the
// node runs on every device that registers them (on a GPU the Triton kernels,
// mmdropit/kernels/cuda/nodes.py).
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "dispatched_ops.h"

namespace mmdropit {

using mmdropit_dispatched::pack_between;
using mmdropit_dispatched::where_bits;
using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// grad_fn: torch::autograd::CppNode<mmdropit::LeanActivationNode>
struct LeanActivationNode : public torch::autograd::Function<LeanActivationNode> {
  // ReLU where not `bounded` (low 0), Hardtanh(low, high) where it is.
  static at::Tensor forward(AutogradContext* ctx, at::Tensor x, double low, double high,
                            bool bounded, bool inplace) {
    at::Tensor bits = pack_between(x.view(-1), low, high, bounded);
    at::Tensor out;
    if (bounded) {
      out = inplace ? at::hardtanh_(x, low, high) : at::hardtanh(x, low, high);
    } else {
      out = inplace ? at::relu_(x) : at::relu(x);
    }
    if (inplace) ctx->mark_dirty({x});
    ctx->save_for_backward({bits});
    return out;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor grad = grads[0].contiguous();
    return {where_bits(grad.view(-1), saved[0]).view(grad.sizes()), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

}  // namespace mmdropit

namespace {

using mmdropit::LeanActivationNode;

at::Tensor lean_relu(const at::Tensor& x) {
  return LeanActivationNode::apply(x, 0.0, 0.0, false, false);
}

at::Tensor& lean_relu_(at::Tensor& x) {
  LeanActivationNode::apply(x, 0.0, 0.0, false, true);
  return x;
}

at::Tensor lean_hardtanh(const at::Tensor& x, double min_val, double max_val) {
  return LeanActivationNode::apply(x, min_val, max_val, true, false);
}

at::Tensor& lean_hardtanh_(at::Tensor& x, double min_val, double max_val) {
  LeanActivationNode::apply(x, min_val, max_val, true, true);
  return x;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mmdropit_cpu, m) {
  m.def("lean_relu(Tensor x) -> Tensor");
  m.def("lean_relu_(Tensor(a!) x) -> Tensor(a!)");
  m.def("lean_hardtanh(Tensor x, float min_val, float max_val) -> Tensor");
  m.def("lean_hardtanh_(Tensor(a!) x, float min_val, float max_val) -> Tensor(a!)");
}

TORCH_LIBRARY_IMPL(mmdropit_cpu, CompositeImplicitAutograd, m) {
  m.impl("lean_relu", &lean_relu);
  m.impl("lean_relu_", &lean_relu_);
  m.impl("lean_hardtanh", &lean_hardtanh);
  m.impl("lean_hardtanh_", &lean_hardtanh_);
}
