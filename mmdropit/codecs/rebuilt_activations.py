"""Rebuilt activations: the layer after a GELU / SiLU keeps no copy of the activation's output;
it keeps a note to rebuild it, in backward, from the activation's input, which the activation
keeps anyway. Exact (the rebuilt output is the same computation on the same input, so every
gradient is the same bit for bit), and the step holds one tensor where it held two.

An activation whose backward reads its input (GELU, SiLU, Hardswish, Mish) saves that input;
the Linear or convolution it feeds saves the output for its weight gradient, a tensor of the
same size: in a transformer's MLP the two are the block's largest (four times the width each),
a fifth of DeiT-S's activations. Here the converted activation notes its input and output as
it returns (a note nobody reads holds the input while the output lives, not after), and the
converted layer, when called on that very output, runs under saved-tensor hooks whose pack hook
stores, for that output (or a view of its storage, as ``F.linear`` saves), the note instead:
the activation's input, its module, the view's shape and strides. The unpack hook hands back
the output itself while something else keeps it unchanged, and otherwise runs the activation's
own forward on the input again (autograd puts the result in the output's place in the graph:
double backward holds). The layer's other saved tensors keep autograd's in-place check (the
unpack hook compares their version counters).

Steps aside (runs as the plain modules) wherever another technique manages saved tensors or
the output does not reach the layer unchanged: inside any non-reentrant checkpoint (a
reentrant one recomputes without saved-tensor hooks: rebuilt there too), offload or
``save_on_cpu`` region (hooks that keep saved tensors their own way are on autograd's stack
there; a meter's only look: :func:`~mmdropit.common.saved_tensors.storing_hooks_active`); for
an activation whose saved tensors are compressed (:mod:`.activations`: its input is not kept);
while ``torch.compile`` traces (its partitioner recomputes cheap operators itself); for an
activation whose input does not require grad; and when something between them (a dropout
with ``p > 0``, a norm) makes a new tensor. A ReLU saves its output, which the next layer
shares already: nothing to gain, so ReLU is not converted.

Example:
    >>> from torch import nn
    >>> net = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 8))
    >>> with RebuiltActivationsConfig().apply(net) as applied:
    ...     applied.summary
    ...     net(torch.randn(32, 64)).sum().backward()
    'rebuilt activations: 1 activations, 2 layers converted'
    >>> type(net[1]).__name__
    'GELU'
"""
from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import InitVar, dataclass
from typing import ClassVar, NamedTuple

import torch
from torch import nn

from ..common.class_swap import ClassSwap
from ..common.name_patterns import checked_list
from ..common.saved_tensors import report_kept, storing_hooks_active
from ..common.technique import Applied
from ..errors import ConfigError
from .activations import CompressedActivations

DEFAULT_TYPES: tuple[type[nn.Module] | str, ...] = (
    nn.GELU, nn.SiLU, nn.Hardswish, nn.Mish, 'GELU', 'GELUTanh', 'QuickGELU', 'Swish',
    'HardSwish')
"""Activations converted by default: those whose backward reads their input (timm's own
classes, and mmcv's ``Swish``, by name)."""
LAYER_TYPES = (nn.Linear, nn.modules.conv._ConvNd)
"""Layers that keep a note instead of an activation's output they are called on."""

_SWAP = ClassSwap('Rebuilt')


@dataclass(frozen=True, eq=False)
class _Note:
    """A converted activation's call, as the layer after it needs it.

    Attributes:
        output: The output, weakly.
        box: Holds the input while the output lives (the weak reference's callback empties
            it): a note nobody reads holds nothing once the output is gone.
        forward: The activation's own forward (the class below the technique's layer).
        module: The activation.
        versions: The input's and the output's version counters when it ran.
    """

    output: weakref.ref
    box: list[torch.Tensor]
    forward: Callable[[nn.Module, torch.Tensor], torch.Tensor]
    module: nn.Module
    versions: tuple[int, int]


class _Latest(threading.local):
    """The last converted activation's :class:`_Note` on this thread."""

    def __init__(self) -> None:
        super().__init__()
        self.note: _Note | None = None


_LATEST = _Latest()


@dataclass(frozen=True, eq=False)
class _Rebuild:
    """What a layer keeps instead of an activation's output: enough to compute it again."""

    note: _Note
    source: torch.Tensor
    output: weakref.ref
    shape: torch.Size
    stride: tuple[int, ...]
    dtype: torch.dtype

    def tensor(self) -> torch.Tensor:
        """The output (in the view the layer saved): the output itself while something else
        keeps it unchanged, else computed again from the input."""
        source_version, output_version = self.note.versions
        if self.source._version != source_version:
            raise RuntimeError('rebuilt activations: the input of an activation was modified '
                               'in place after its forward pass; its output cannot be rebuilt')
        output = self.output()
        if output is None or output._version != output_version:
            if torch.is_grad_enabled():  # double backward: autograd places the output itself
                with torch.no_grad():
                    output = self.note.forward(self.note.module, self.source)
            else:
                output = self.note.forward(self.note.module, self.source)
            if output.dtype != self.dtype:
                raise RuntimeError(f'rebuilt activations: {type(self.note.module).__name__} '
                                   f'gave {output.dtype} in backward where it gave {self.dtype} '
                                   'in its forward pass: leave it out of types')
        if output.shape == self.shape and output.stride() == self.stride:
            return output
        return output.as_strided(self.shape, self.stride)


def _plain(x: torch.Tensor) -> bool:
    """Whether ``x`` is a plain tensor outside any functorch transform (``torch.func`` wraps
    tensors without storages of their own; a subclass may have none either)."""
    return type(x) in (torch.Tensor, nn.Parameter) and \
        not torch._C._are_functorch_transforms_active()


class RebuildingActivation:
    """Mixin put in front of a converted activation's class: notes its input and output."""

    def forward(self, *args, **kwargs) -> torch.Tensor:
        output = super().forward(*args, **kwargs)
        if len(args) != 1 or kwargs:  # called otherwise than on one input: left plain
            return output
        x = args[0]
        if (not torch.compiler.is_compiling() and torch.is_grad_enabled() and x.requires_grad
                and not storing_hooks_active() and _plain(x) and not _compressed(self)
                and type(output) is torch.Tensor and output._base is None
                and output.storage_offset() == 0
                and output.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()):
            # a fresh output (an in-place activation's is its input: nothing to rebuild from)
            box = [x]
            _LATEST.note = _Note(weakref.ref(output, lambda _ref: box.clear()), box,
                                 _SWAP.base_of(self).forward, self,
                                 (x._version, output._version))
        return output


def _compressed(module: nn.Module) -> bool:
    """Whether ``module`` stores what it saves as codes (:mod:`.activations`): its input is not
    kept dense, and a note would keep it."""
    return isinstance(module, CompressedActivations) and module.compression.bits is not None


class RebuildingLayer:
    """Mixin put in front of a converted layer's class: called on the last noted activation
    output, it keeps a note to rebuild it instead of the output."""

    def forward(self, *args, **kwargs) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return super().forward(*args, **kwargs)
        note, _LATEST.note = _LATEST.note, None
        x = args[0] if len(args) == 1 and not kwargs else None
        if note is None or note.output() is not x or storing_hooks_active() or not _plain(x):
            return super().forward(*args, **kwargs)
        # the pack hook is kept with every tensor it packs (the weight's too): it holds
        # neither the output nor, once this call returns, the input
        held = [note]
        storage, offset, numel = x.untyped_storage().data_ptr(), x.storage_offset(), x.numel()
        output_version = note.versions[1]

        def pack(tensor: torch.Tensor) -> torch.Tensor | _Rebuild:
            if (held and tensor.untyped_storage().data_ptr() == storage
                    and tensor.storage_offset() == offset and tensor.numel() == numel
                    and tensor._version == output_version):
                kept = held[0]
                report_kept(kept.box[0])  # kept by the activation already: counted once
                return _Rebuild(kept, kept.box[0], kept.output, tensor.shape, tensor.stride(),
                                tensor.dtype)
            report_kept(tensor)
            return _Saved(tensor, tensor._version)  # autograd checks no hooked tensor itself

        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, _unpack):
                return super().forward(x)
        finally:
            held.clear()


class _Saved(NamedTuple):
    """A tensor the layer saved as it is, with its version counter then."""

    tensor: torch.Tensor
    version: int


def _unpack(saved: _Saved | _Rebuild) -> torch.Tensor:
    if isinstance(saved, _Rebuild):
        return saved.tensor()
    if saved.tensor._version != saved.version:
        raise RuntimeError('one of the variables needed for gradient computation has been '
                           'modified by an inplace operation (a tensor a layer saved under '
                           'rebuilt activations)')
    return saved.tensor


def rebuildable_activations(model: nn.Module, types: Sequence[type | str] = DEFAULT_TYPES
                            ) -> list[nn.Module]:
    """The activations of ``model`` of ``types`` (classes, or class names) not converted yet,
    in-place ones left out (their output is their input: nothing to rebuild from)."""
    return [module for module in model.modules()
            if not _SWAP.is_swapped(module) and not getattr(module, 'inplace', False) and any(
                type(module).__name__ == kind if isinstance(kind, str)
                else isinstance(module, kind) for kind in types)]


@dataclass(frozen=True)
class RebuiltActivationsConfig:
    """Rebuilt activations (see the module): the chosen activations, and every Linear and
    convolution, converted in place.

    Args:
        types: Activation classes, or class names, to convert (``None``:
            :data:`DEFAULT_TYPES`); each must compute its output from its one input alone.
        where: Who gives the values, to start error messages with (not stored).

    Raises:
        ConfigError: ``types`` is not a list.

    Config example::

        custom_hooks = [dict(type='RebuiltActivationsHook')]
    """

    name: ClassVar[str] = 'rebuilt-activations'
    lossy: ClassVar[bool] = False

    types: tuple[type[nn.Module] | str, ...] | None = None
    where: InitVar[str] = 'rebuilt activations'

    def __post_init__(self, where: str) -> None:
        object.__setattr__(self, 'types', checked_list(
            self.types, f"{where} types take a list, e.g. types=['GELU', 'SiLU']", (str, type)))

    def apply(self, model: nn.Module) -> AppliedRebuilt:
        """Convert ``model``'s chosen activations and its Linear and convolution layers in
        place (Parameters and ``state_dict`` keys unchanged).

        Raises:
            ConfigError: If no activation matches.
        """
        types = DEFAULT_TYPES if self.types is None else self.types
        activations = rebuildable_activations(model, types)
        if not activations:
            names = ', '.join(dict.fromkeys(t if isinstance(t, str) else t.__name__
                                            for t in types))
            raise ConfigError(f'rebuilt activations found no activation of '
                              f'{type(model).__name__} of the types {names} (in place ones '
                              'are left out): give types=')
        layers = [module for module in model.modules()
                  if isinstance(module, LAYER_TYPES) and not _SWAP.is_swapped(module)]
        for module in activations:
            _SWAP.swap_in(module, RebuildingActivation)
        for module in layers:
            _SWAP.swap_in(module, RebuildingLayer)
        return AppliedRebuilt(activations + layers, len(activations), len(layers))

    def to_json(self) -> dict:
        types = None if self.types is None else [
            kind if isinstance(kind, str) else kind.__name__ for kind in self.types]
        return dict(types=types)


class AppliedRebuilt(Applied):
    """Rebuilt activations in effect; :meth:`remove` restores every converted module."""

    def __init__(self, modules: list[nn.Module], activations: int, layers: int) -> None:
        super().__init__(lambda: [_SWAP.swap_out(module) for module in modules],
                         f'rebuilt activations: {activations} activations, {layers} layers '
                         'converted')


def rebuild_activations(model: nn.Module,
                        types: Sequence[type | str] | None = None) -> AppliedRebuilt:
    """Rebuilt activations on ``model``, in place (``RebuiltActivationsConfig(types)
    .apply(model)``); the returned object's ``remove()`` undoes it.

    Raises:
        ConfigError: ``types`` is not a list, or no activation matches.
    """
    return RebuiltActivationsConfig(types).apply(model)
