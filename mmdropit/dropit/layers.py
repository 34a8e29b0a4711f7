"""DropIT and lean-activation layers, made by swapping the class of an existing module.

A converted module stays the same object with the same Parameters, buffers, attributes and
``state_dict`` keys, and is still an instance of its original class (``isinstance(m, nn.Conv2d)``
holds): its class becomes a subclass of the original with a DropIT mixin in front
(:mod:`mmdropit.common.class_swap`, which also says how it stacks with a checkpoint's swap).
Optimizers, DDP/FSDP wrappers, EMA copies, ``load_from`` and ``resume`` see no difference.

A DropIT layer runs its original ``forward`` (so subclasses such as mmcv's conv wrappers or timm's
``Conv2dSame`` keep their own logic) inside a ``TorchFunctionMode`` that sends the layer's own
``F.linear`` / ``F.conv*d`` / ``torch.addmm`` (transformers' ``Conv1D``) call, recognised by its
weight, to :mod:`.functional`. In eval mode, under ``torch.no_grad``, with a frozen weight or
with gamma 0 it runs the plain forward with no mode at all.

Example:
    >>> layer = nn.Linear(16, 4)
    >>> weight = layer.weight
    >>> convert_layer(layer, DropITState('fc', 0.9, 0.9, 'mink'))
    >>> isinstance(layer, nn.Linear), layer.weight is weight, type(layer).__name__
    (True, True, 'DropITLinear')
    >>> restore_layer(layer); type(layer).__name__
    'Linear'
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ..common.class_swap import ClassSwap
from .functional import dropit_conv, dropit_linear
from .lean_activations import lean_hardtanh, lean_leaky_relu, lean_relu
from .state import DropITState

CONV_TYPES = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


def _transformers_conv1d() -> tuple[type, ...]:
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:
        return ()
    return (Conv1D,)


TRANSFORMERS_CONV1D = _transformers_conv1d()
DROPIT_TYPES = (nn.Linear, *CONV_TYPES, *TRANSFORMERS_CONV1D)
LEAN_ACTIVATION_TYPES = (nn.ReLU, nn.Hardtanh, nn.LeakyReLU)


def _linear_args(input, weight, bias=None):  # noqa: A002  (F.linear's own names)
    return input, weight, bias


def _conv_args(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):  # noqa: A002
    return input, weight, bias, stride, padding, dilation, groups


def _addmm_args(input, mat1, mat2, *, beta=1, alpha=1):  # noqa: A002
    return input, mat1, mat2, beta, alpha


class _RouteOwnCall(TorchFunctionMode):
    """Sends the layer's own linear/conv call (matched by its weight) to the DropIT function."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        weight, state = self.layer.weight, self.layer.dropit
        if func is torch.nn.functional.linear:
            x, w, bias = _linear_args(*args, **kwargs)
            if w is weight and x.numel():
                return dropit_linear(x, w, bias, state)
        elif func in _CONV_FUNCTIONS:
            x, w, bias, stride, padding, dilation, groups = _conv_args(*args, **kwargs)
            if w is weight and x.numel():
                return dropit_conv(x, w, bias, stride, padding, dilation, groups, state)
        elif func is torch.addmm:  # transformers' Conv1D: addmm(bias, x2d, weight)
            bias, x, w, beta, alpha = _addmm_args(*args, **kwargs)
            if w is weight and beta == 1 and alpha == 1 and x.numel():
                return dropit_linear(x, w.t(), bias, state)
        return func(*args, **kwargs)


_CONV_FUNCTIONS = (torch.conv1d, torch.conv2d, torch.conv3d)


_CONV_CLASSES = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


def _own_forward(cls: type) -> str | None:
    """``'linear'`` / ``'conv'`` where a converted class runs ``nn.Linear``'s or an
    ``nn.ConvNd``'s own forward and convolution (not a subclass's), else ``None``."""
    own = super(DropITLayerMixin, cls)  # type: ignore[misc]
    if own.forward is nn.Linear.forward:
        return 'linear'
    for conv in _CONV_CLASSES:
        if own.forward is conv.forward and own._conv_forward is conv._conv_forward:
            return 'conv'
    return None


class DropITLayerMixin:
    """Put in front of a Linear / Conv class: its forward saves a compact input.

    Attributes:
        dropit: The layer's :class:`DropITState` (gamma, strategy, counters).
    """

    dropit: DropITState
    _dropit_own_call: str | None = None
    """:func:`_own_forward` of the class, set when the class is made (a class attribute is a
    constant to dynamo, which evaluates ``_own_forward``'s ``super()`` test to ``None``)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._dropit_own_call = _own_forward(cls)

    def _dropit_engaged(self) -> bool:
        return (self.training and self.dropit.gamma > 0 and torch.is_grad_enabled()
                and self.weight.requires_grad)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        # the checks of _dropit_engaged inline, each attribute read once: this runs at every
        # call of every layer, and a host-bound GPU step pays its host time one for one
        state, weight = self.dropit, self.weight
        if not (self.training and state.gamma > 0 and torch.is_grad_enabled()
                and weight.requires_grad):
            return super().forward(*args, **kwargs)
        if len(args) == 1 and not kwargs and args[0].numel():
            # nn.Linear's and nn.ConvNd's own forward (zero padding) is one F.linear / F.convNd
            # call: made directly, without the routing mode (a Conv2d's step took ~60 us of
            # host time more through it, paid one for one on a host-bound GPU step)
            own = self._dropit_own_call
            if own == 'linear':
                return dropit_linear(args[0], weight, self.bias, state)
            if own == 'conv' and self.padding_mode == 'zeros':
                return dropit_conv(args[0], weight, self.bias, self.stride, self.padding,
                                   self.dilation, self.groups, state)
        with _RouteOwnCall(self):
            return super().forward(*args, **kwargs)

    def extra_repr(self) -> str:
        own = super().extra_repr()
        state = self.dropit
        return f'{own}, dropit={state.strategy}(gamma={state.gamma:g})'


class LeanReLUMixin:
    """ReLU that keeps a 1-bit mask for backward."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002
        return lean_relu(input, self.inplace)


class LeanHardtanhMixin:
    """Hardtanh / ReLU6 that keeps a 1-bit mask for backward."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002
        return lean_hardtanh(input, self.min_val, self.max_val, self.inplace)


class LeanLeakyReLUMixin:
    """LeakyReLU that keeps a 1-bit mask for backward."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002
        return lean_leaky_relu(input, self.negative_slope, self.inplace)


_LEAN_MIXINS = ((nn.LeakyReLU, LeanLeakyReLUMixin), (nn.Hardtanh, LeanHardtanhMixin),
                (nn.ReLU, LeanReLUMixin))
_SWAP = ClassSwap()


def is_converted(module: nn.Module) -> bool:
    """Whether ``module`` is a DropIT layer or a lean activation made by this module."""
    return _SWAP.is_swapped(module)


def is_dropit_layer(module: nn.Module) -> bool:
    """Whether ``module`` is a DropIT layer."""
    return is_converted(module) and isinstance(module, DropITLayerMixin)


def lean_mixin_for(module: nn.Module) -> type | None:
    """The lean mixin for an activation whose class keeps PyTorch's own ``forward``."""
    for base, mixin in _LEAN_MIXINS:
        if isinstance(module, base) and type(module).forward is base.forward:
            return mixin
    return None


def convert_layer(module: nn.Module, state: DropITState) -> None:
    """Make ``module`` (Linear, Conv1d/2d/3d or transformers' Conv1D) a DropIT layer in place."""
    if not is_converted(module):
        _SWAP.swap_in(module, DropITLayerMixin, prefix='DropIT')
    module.dropit = state


def convert_activation(module: nn.Module) -> bool:
    """Make a ReLU / Hardtanh / ReLU6 / LeakyReLU lean in place; ``False`` if not supported."""
    mixin = lean_mixin_for(module)
    if mixin is None or is_converted(module):
        return False
    _SWAP.swap_in(module, mixin, prefix='Lean')
    return True


def restore_layer(module: nn.Module) -> None:
    """Undo :func:`convert_layer` or :func:`convert_activation` in place."""
    if _SWAP.swap_out(module):
        module.__dict__.pop('dropit', None)
