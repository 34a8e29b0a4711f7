"""DropIT linear and convolution as autograd Functions (the functional side of the layers).

The forward pass computes the usual output from the dense input and saves, for the weight
gradient, only the kept elements of that input in compact form (:mod:`.compact`, through the
custom operators of :mod:`.ops` for the fixed-count strategies, so ``torch.compile`` traces the
layer whole; optionally with 8-bit values, :mod:`.quantize`), with ``ctx.save_for_backward`` so
that memory meters see exactly what is kept. The backward pass computes the input gradient
from the weight (exact), the bias gradient from the output gradient (exact), and the weight
gradient from the rebuilt sparse input. Each gradient is computed only when autograd needs it;
the input is compressed only when the weight needs a gradient. In the first forward pass of a
checkpoint's region, whose saved tensors are dropped, a fixed-count layer saves placeholders of
the right shapes and selects only when the region is recomputed.

Example:
    >>> from mmdropit.dropit.state import DropITState
    >>> state = DropITState('fc', gamma=0.9, base_gamma=0.9, strategy='mink')
    >>> x = torch.randn(8, 64, requires_grad=True)
    >>> weight = torch.randn(32, 64, requires_grad=True)
    >>> dropit_linear(x, weight, None, state).sum().backward()
    >>> x.grad.shape, weight.grad.shape, round(state.keep_ratio, 2)
    (torch.Size([8, 64]), torch.Size([32, 64]), 0.1)
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch._C._functorch import unwrap_if_dead

from ..common.backward_workspace import note_workspace
from ..common.eager_backward import eager_backward
from ..common.listeners import Listeners
from ..common.random_source import generator
from ..common.recompute_region import in_plain_checkpoint, saved_tensors_dropped
from ..kernels import fused_conv_node, fused_linear_node
from .compact import CompactLayout, dense_layout, flatten_in_memory_order, worth_compressing
from .ops import SavePlan, keep_fixed, keep_sampled, unkeep, unkeep_rows
from .quantize import quantize_kept
from .state import DropITState
from .strategies import FIXED_COUNT, counted_strategy

SaveObserver = Callable[[DropITState, torch.Tensor, CompactLayout], None]
_SAVES: Listeners[[DropITState, torch.Tensor, CompactLayout]] = Listeners()


def observe_saves(observer: SaveObserver) -> contextlib.AbstractContextManager[None]:
    """Call ``observer(state, dense_input, layout)`` each time a DropIT layer saves its input."""
    return _SAVES.listening(observer)


def _save_plan(x: torch.Tensor, state: DropITState) -> SavePlan:
    """The layer's plan for saving the contiguous ``x``, made again when ``x``'s shape, dtype
    or device, gamma or the strategy changed."""
    plan = state.save_plan
    if plan is None or plan.key != SavePlan.key_of(x, state.gamma, state.strategy):
        plan = state.save_plan = SavePlan(x, state.gamma, state.strategy)
    return plan


def _save_input(x: torch.Tensor, state: DropITState) -> tuple[tuple[torch.Tensor, ...],
                                                                CompactLayout]:
    if not x.is_contiguous() or torch.compiler.is_compiling():
        return _save_any(x, state)
    plan = _save_plan(x, state)
    if plan.compress:
        flat = x.view(-1)
        if plan.fixed or in_plain_checkpoint():  # mink_approx selects as mink there
            tensors, layout = plan.keep(flat), plan.layout
        else:
            tensors, layout = keep_sampled(flat, state.gamma, x.shape, None)
        state.count(tensors[-1].numel(), plan.numel, x.device)
        note_workspace(plan.workspace)  # backward rebuilds the dense input
        if state.value_bits is not None:
            tensors, layout = quantize_kept(tensors, layout, state.value_bits)
    else:
        state.warn_dense_once(str(x.dtype).removeprefix('torch.'))
        tensors, layout = (x,), plan.layout
        state.count(plan.numel, plan.numel, x.device)
    if _SAVES:
        _SAVES.notify(state, x, layout)
    return tensors, layout


def _save_any(x: torch.Tensor, state: DropITState) -> tuple[tuple[torch.Tensor, ...],
                                                             CompactLayout]:
    """:func:`_save_input` for any input (one that is not contiguous, channels_last or a slice,
    is read in memory order) and while compiled, deciding at each call."""
    if worth_compressing(state.gamma, x.element_size()):
        flat, order = flatten_in_memory_order(x)
        if state.strategy in FIXED_COUNT or in_plain_checkpoint():
            tensors, layout = keep_fixed(flat, state.gamma, counted_strategy(state.strategy),
                                         x.shape, order, placeholders=saved_tensors_dropped())
        else:
            tensors, layout = keep_sampled(flat, state.gamma, x.shape, order)
        state.count(tensors[-1].numel(), x.numel(), x.device)
        note_workspace(x.numel() * x.element_size())  # backward rebuilds the dense input
        if state.value_bits is not None:
            tensors, layout = quantize_kept(tensors, layout, state.value_bits)
    else:
        state.warn_dense_once(str(x.dtype).removeprefix('torch.'))
        tensors, layout = (x,), dense_layout(x)
        state.count(x.numel(), x.numel(), x.device)
    if _SAVES:
        _SAVES.notify(state, x, layout)
    return tensors, layout


def _linear_not_a_view(x: torch.Tensor, weight: torch.Tensor,
                       bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` returned as a tensor of its own, not as a view: for inputs
    of more than two dimensions ``F.linear`` returns a view of a 2-d product, and a custom
    Function's output that is a view may not be changed in place (DETR's heads do)."""
    if x.dim() <= 2:
        return F.linear(x, weight, bias)
    out = x.new_empty(*x.shape[:-1], weight.shape[0])
    flat = x.reshape(-1, x.shape[-1])
    if bias is None:
        torch.mm(flat, weight.t(), out=out.view(-1, weight.shape[0]))
    else:
        torch.addmm(bias, flat, weight.t(), out=out.view(-1, weight.shape[0]))
    return out


@eager_backward
class DropITLinearFunction(torch.autograd.Function):
    """``F.linear`` whose saved input is the compact kept part (see the module docstring)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                state: DropITState) -> torch.Tensor:
        saved: tuple[torch.Tensor, ...] = ()
        ctx.layout = None
        if ctx.needs_input_grad[1]:
            saved, ctx.layout = _save_input(x, state)
        ctx.save_for_backward(weight, *saved)
        return _linear_not_a_view(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        weight, *saved = ctx.saved_tensors
        need_input, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_input = grad_weight = grad_bias = None
        matrix = grad_out.dim() == 2  # a batch of rows: no reshaping (views cost host time)
        flat_grad = grad_out if matrix else grad_out.reshape(-1, grad_out.shape[-1])
        if need_weight:  # first: the rebuilt input is freed before grad_input takes memory
            grad_weight = flat_grad.t().mm(unkeep_rows(tuple(saved), ctx.layout))
        if need_input:
            grad_input = grad_out.mm(weight) if matrix else grad_out.matmul(weight)
        if need_bias:
            grad_bias = flat_grad.sum(0)
        return grad_input, grad_weight, grad_bias, None


@eager_backward
class DropITConvFunction(torch.autograd.Function):
    """``torch.convolution`` (N-d, not transposed) whose saved input is compact.

    ``pads`` (``F.pad`` order) is zero padding applied before the convolution, for uneven
    ``'same'`` padding: the unpadded input is what gets compressed, so padding zeros do not count
    towards gamma.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                stride: list[int], padding: list[int], dilation: list[int], groups: int,
                pads: list[int] | None, state: DropITState) -> torch.Tensor:
        spatial = weight.dim() - 2
        ctx.conv_args = (stride, padding, dilation, False, [0] * spatial, groups)
        ctx.pads = pads
        ctx.bias_sizes = None if bias is None else [bias.shape[0]]
        saved: tuple[torch.Tensor, ...] = ()
        ctx.layout = None
        if ctx.needs_input_grad[1]:
            saved, ctx.layout = _save_input(x, state)
        if pads is not None:
            x = F.pad(x, pads)
        ctx.input_shape = x.shape
        ctx.save_for_backward(weight, *saved)
        return torch.convolution(x, weight, bias, *ctx.conv_args)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        weight, *saved = ctx.saved_tensors
        need_input, need_weight, need_bias = ctx.needs_input_grad[:3]
        need_bias = need_bias and ctx.bias_sizes is not None
        grad_input = grad_weight = grad_bias = None
        if need_weight:  # first, alone: the rebuilt input is freed before grad_input exists
            x = unkeep(tuple(saved), ctx.layout)
            if ctx.pads is not None:
                x = F.pad(x, ctx.pads)
            _, grad_weight, grad_bias = torch.ops.aten.convolution_backward(
                grad_out, x, weight, ctx.bias_sizes, *ctx.conv_args, [False, True, need_bias])
            del x
        if need_input or (need_bias and not need_weight):
            shape_only = grad_out.new_empty(1).expand(ctx.input_shape)  # as conv2d_input reads
            grad_input, _, bias_grad = torch.ops.aten.convolution_backward(
                grad_out, shape_only, weight, ctx.bias_sizes, *ctx.conv_args,
                [need_input, False, need_bias and not need_weight])
            grad_bias = grad_bias if need_weight else bias_grad
        if grad_input is not None and ctx.pads is not None:
            grad_input = F.pad(grad_input, [-p for p in ctx.pads])  # crop the padding
        return grad_input, grad_weight, grad_bias, None, None, None, None, None, None


def _unchecked_apply(function: type[torch.autograd.Function]) -> Callable:
    """``function.apply`` without ``autograd.Function``'s Python wrapper, which binds default
    arguments for ``setup_context`` (these functions have none) and hands the call to
    functorch when a transform is active (:func:`_apply` checks that first): ~2 us of host time
    a call here."""
    return super(torch.autograd.Function, function).apply


def _apply(function: type[torch.autograd.Function], unchecked: Callable, *args):
    if torch._C._are_functorch_transforms_active():
        return function.apply(*args)
    return unchecked(unwrap_if_dead(args[0]), *args[1:])


# whether autocast is on for any device: one call, where asking for the input's device is three
_IS_ANY_AUTOCAST_ENABLED = getattr(torch._C, '_is_any_autocast_enabled', None) or (
    lambda: any(torch.is_autocast_enabled(device) for device in ('cpu', 'cuda')))


def _autocast(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    """Cast like autocast would (linear and conv run in the autocast dtype) and switch autocast
    off inside, so the saved input is stored in that dtype (fp16 or bf16)."""
    device_type = x.device.type
    if not torch.is_autocast_enabled(device_type):
        return x, weight, bias, contextlib.nullcontext()
    dtype = torch.get_autocast_dtype(device_type)
    cast = [None if t is None else t.to(dtype) for t in (x, weight, bias)]
    return (*cast, torch.autocast(device_type, enabled=False))


def dropit_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  state: DropITState) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` saving only the kept part of ``x`` for backward.

    Under autocast the layer computes and saves in the autocast dtype (fp16 or bf16)."""
    if not _IS_ANY_AUTOCAST_ENABLED():
        return _linear(x, weight, bias, state)
    x, weight, bias, autocast_off = _autocast(x, weight, bias)
    with autocast_off:
        return _linear(x, weight, bias, state)


_LINEAR_APPLY = _unchecked_apply(DropITLinearFunction)


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
            state: DropITState) -> torch.Tensor:
    """:class:`DropITLinearFunction` applied, or, where it can run, the C++ autograd node
    that computes the same (:func:`~mmdropit.kernels.fused_linear_node`, :func:`_node_for`)."""
    node = _node_for(x, weight, state, fused_linear_node)
    if node is None:
        return _apply(DropITLinearFunction, _LINEAR_APPLY, x, weight, bias, state)
    return node(x, weight, bias, *_node_selection(x, state))


def _node_for(x: torch.Tensor, weight: torch.Tensor, state: DropITState,
              fused_node: Callable[[torch.Tensor], Callable | None]) -> Callable | None:
    """The C++ node (``fused_node(x)``: ``None`` where no node can take the call) that computes
    the layer's Python Function for this call, with the layer's plan made for ``x``; ``None``
    when it cannot: it keeps a compact selection of any strategy, with no 8-bit values, no
    observer and outside a checkpoint's first pass."""
    if not (weight.requires_grad and torch.is_grad_enabled()) or \
            state.value_bits is not None or _SAVES:
        return None
    node = fused_node(x)
    if node is None or saved_tensors_dropped():
        return None
    return node if _save_plan(x, state).compress else None


def _node_selection(x: torch.Tensor, state: DropITState) -> tuple:
    """The node's arguments after the layer's: the count it keeps, where it selects itself (the
    fused ``mink`` and, with the generator it draws from, ``random``, in the bitmask encoding),
    else also the selection it is given (another strategy's, or an encoding it does not select
    in, made here as the Python Function makes it). Either way counted into the layer's state,
    and the dense input that backward rebuilds noted (what the Python Functions do)."""
    plan = state.save_plan
    if not plan.fused_node:  # selected outside autograd, as inside a Function's forward
        first, values = _save_input(x.detach(), state)[0]
        return values.numel(), first, values
    state.count(plan.kept, plan.numel, x.device)
    note_workspace(plan.workspace)
    if plan.counted == 'random':  # the node draws its seed from the plugin's generator
        return plan.kept, None, None, generator(x.device)
    return (plan.kept,)


def _tuple(value: int | Sequence[int], spatial: int) -> list[int]:
    return [value] * spatial if isinstance(value, int) else list(value)


def dropit_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                stride: int | Sequence[int], padding: str | int | Sequence[int],
                dilation: int | Sequence[int], groups: int, state: DropITState) -> torch.Tensor:
    """``F.conv{1,2,3}d`` with the same arguments (``padding`` may be ``'same'`` or
    ``'valid'``), saving only the kept part of ``x`` for backward (in the autocast dtype under
    autocast)."""
    spatial = weight.dim() - 2
    stride, dilation = _tuple(stride, spatial), _tuple(dilation, spatial)
    pads = None
    if padding == 'valid':
        padding = [0] * spatial
    elif padding == 'same':
        totals = [d * (k - 1) for d, k in zip(dilation, weight.shape[2:])]
        if all(total % 2 == 0 for total in totals):
            padding = [total // 2 for total in totals]
        else:  # uneven: the extra row/column goes after, as in PyTorch's own 'same'
            pads = [p for total in reversed(totals) for p in (total // 2, total - total // 2)]
            padding = [0] * spatial
    else:
        padding = _tuple(padding, spatial)
    x, weight, bias, autocast_off = _autocast(x, weight, bias)
    with autocast_off:
        node = None if pads is not None else _node_for(x, weight, state, fused_conv_node)
        if node is None:
            return DropITConvFunction.apply(x, weight, bias, stride, padding, dilation, groups,
                                            pads, state)
        return node(x, weight, bias, stride, padding, dilation, groups,
                    *_node_selection(x, state))
