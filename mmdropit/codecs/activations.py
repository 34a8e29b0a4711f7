"""Compress what DropIT cannot reach: tensors saved inside normalisation, activation and
attention modules, stored as per-group int8 (:mod:`.int8`) or 4 / 2-bit codes (:mod:`.low_bit`).

:func:`~.config.compress_activations` (a :class:`~.config.CompressionConfig` applied) converts
chosen modules of a model in place: each runs its forward under
``torch.autograd.graph.saved_tensors_hooks`` whose pack hook stores every floating tensor of at
least :data:`MIN_NUMEL` elements that autograd saves there in ``bits`` bits (int8 codes with a
float32 scale per 32 values; or 4 / 2-bit codes with a minimum and step per 32 values, rounded
stochastically), and whose unpack hook rebuilds it for the backward pass (the approach of ActNN
and GACT, without their CUDA kernels), a saved view with the strides it had
(:mod:`.saved_views`: a backward graph that ``torch.compile`` built asserts them). Parameters
and small or integer tensors (indices, DropIT's bitmasks) pass unchanged. The dense tensor is
freed when nothing else holds it: a LayerNorm's or GELU's input, a BatchNorm's input, the query
/ key / value and output that attention saves. A tensor that another (unconverted) op also saves
stays alive, and then the codes are extra memory: compare the step peak, not only the saved
bytes (``tools/benchmark.py``'s ``*-int8-acts`` variants report both).

The gradient is that of the rounded activations: in 8 bits each element errs by at most half a
step, ``max|v| / 254`` of its group of 32; in 4 and 2 bits by less than one step,
``(max - min) / 15`` or ``/ 3`` of its group, without bias.

Inside a segment that a plain checkpoint recomputes (:mod:`mmdropit.common.recompute_region`),
a converted module hands its saved tensors to the checkpoint's hooks: the checkpoint drops them
in the first pass and holds their codes once the segment is recomputed (:mod:`.recomputed`).
Inside a selective checkpoint, and while a step is recorded for a plan, it steps aside and runs
as the plain module.

Default modules (:data:`DEFAULT_TYPES`): LayerNorm, GroupNorm, BatchNorm, GELU, SiLU, Softmax
and modules whose class is named ``Attention`` (timm's, with their qkv / proj layers: a DropIT
layer's kept values inside are then stored in int8 too, like ``value_bits=8``).

Example:
    >>> from torch import nn
    >>> from mmdropit.codecs import compress_activations
    >>> net = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.LayerNorm(256), nn.Linear(256, 8))
    >>> compress_activations(net, bits=8)
    ['1', '2']
    >>> net(torch.randn(32, 64)).sum().backward()
    >>> restore_activations(net)
    ['1', '2']
    >>> type(net[1]).__name__
    'GELU'
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..common.class_swap import ClassSwap
from ..common.listeners import Listeners
from ..common.name_patterns import matches
from ..common.recompute_region import checkpoint_pass, in_recomputed_region, innermost_pass
from ..common.saved_tensors import report_kept
from ..errors import ConfigError
from .bits import dequantize_values, quantize_values
from .derivative_codes import CODE_BITS, derivative_table, lean_activation
from .recomputed import checkpoint_hooks
from .saved_views import ViewLayout, elements_apart

MIN_NUMEL = 4096
"""Smaller saved tensors stay as they are (their codes would save little)."""
DEFAULT_TYPES: tuple[type[nn.Module] | str, ...] = (
    nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._BatchNorm, nn.GELU, nn.SiLU, nn.Softmax,
    'Attention')
"""Module types converted by default; a string matches a class name (timm's ``Attention``)."""


@dataclass(frozen=True)
class _Codes:
    """A saved tensor as integer codes: enough to rebuild it for backward."""

    codes: tuple[torch.Tensor, ...]
    bits: int
    shape: torch.Size
    dtype: torch.dtype
    layout: ViewLayout | None


@dataclass(frozen=True)
class Compression:
    """How a converted module stores what it saves.

    Attributes:
        name: The module's qualified name in the converted model (for audits).
        bits: The bit width; ``None`` while :func:`~mmdropit.dropit.adapt_bits` measures the
            exact step (the module then runs as the plain module).
        derivative: For a GELU / SiLU that saves 4-bit codes of its derivative instead
            (:mod:`.derivative_codes`), which one (``'gelu'``, ``'gelu_tanh'``, ``'silu'``);
            ``None`` otherwise.
    """

    name: str
    bits: int | None
    derivative: str | None = None

    @property
    def label(self) -> str:
        """How the saved tensors are stored, in words (``'8-bit'``, ``'4-bit derivative'``)."""
        return f'{self.bits}-bit' if self.derivative is None else f'{CODE_BITS}-bit derivative'


CompressionObserver = Callable[[Compression, torch.Tensor, int], None]
"""``observer(compression, dense, code_bytes)``, called when a converted module stores a saved
tensor as codes (inside a plain checkpoint: when the recomputation stores it)."""
_COMPRESSIONS: Listeners[[Compression, torch.Tensor, int]] = Listeners()


def observe_compression(observer: CompressionObserver) -> contextlib.AbstractContextManager[None]:
    """Call ``observer`` each time a converted module stores a saved tensor as codes."""
    return _COMPRESSIONS.listening(observer)


def worth_codes(tensor: torch.Tensor) -> bool:
    """Whether a saved tensor is worth storing as codes: floating, of at least
    :data:`MIN_NUMEL` elements, not a parameter (which stays held anyway)."""
    return (tensor.is_floating_point() and tensor.numel() >= MIN_NUMEL
            and not (tensor.requires_grad and tensor.is_leaf))


def _stored_as_codes(tensor: torch.Tensor) -> bool:
    """Whether a saved tensor is stored as codes: worth it, and no two of its elements in one
    place (an expanded tensor's codes would outweigh the storage it views, and could not come
    back with its strides)."""
    return worth_codes(tensor) and (tensor.is_contiguous() or elements_apart(tensor))


@torch.compiler.disable  # called between compiled graphs: runs the fused kernels, not traced
def _pack(compression: Compression, tensor: torch.Tensor) -> torch.Tensor | _Codes:
    if not _stored_as_codes(tensor):
        report_kept(tensor)
        return tensor
    codes = quantize_values(tensor.detach().reshape(-1), compression.bits)
    report_kept(*codes)
    if _COMPRESSIONS:
        _COMPRESSIONS.notify(compression, tensor, sum(code.nbytes for code in codes))
    return _Codes(codes, compression.bits, tensor.shape, tensor.dtype, ViewLayout.of(tensor))


@torch.compiler.disable
def _unpack(saved: torch.Tensor | _Codes) -> torch.Tensor:
    if isinstance(saved, torch.Tensor):
        return saved
    values = dequantize_values(saved.codes, saved.bits, saved.shape.numel(), saved.dtype)
    return values.view(saved.shape) if saved.layout is None else saved.layout.rebuild(values)


class CompressedActivations:
    """Mixin put in front of a converted module's class: its forward runs under the hooks.

    Attributes:
        compression: How the module stores what it saves (set on the instance).
    """

    compression: Compression

    def forward(self, *args, **kwargs):
        if self.compression.bits is None:
            return super().forward(*args, **kwargs)
        current = innermost_pass()
        if current in ('first', 'recomputation'):  # a plain checkpoint's: hand what is saved on
            recomputation = current == 'recomputation'
            hooks = checkpoint_hooks(self.compression.bits, _stored_as_codes, recomputation,
                                     functools.partial(_COMPRESSIONS.notify, self.compression))
            if hooks is None:  # this torch does not say which hooks are the checkpoint's
                return super().forward(*args, **kwargs)
            # marked again: the modules inside see this pass under the hooks handing on
            with hooks, checkpoint_pass(first=not recomputation, recomputation=recomputation):
                return super().forward(*args, **kwargs)
        if in_recomputed_region():  # a selective checkpoint or a recorded step: step aside
            return super().forward(*args, **kwargs)
        pack = functools.partial(_pack, self.compression)
        with torch.autograd.graph.saved_tensors_hooks(pack, _unpack):
            return super().forward(*args, **kwargs)


class LeanDerivative(CompressedActivations):
    """Mixin put in front of a converted GELU's or SiLU's class: it saves 4-bit codes of its
    derivative (:func:`~.derivative_codes.lean_activation`) instead of its input; inside a
    checkpoint plan's region it steps aside (in a model's own ``torch.utils.checkpoint`` it
    saves the same codes in both passes)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if in_recomputed_region():
            return super().forward(x)  # the plain module's forward (see the mixin's)
        if _COMPRESSIONS and torch.is_grad_enabled() and x.requires_grad:
            _COMPRESSIONS.notify(self.compression, x, (x.numel() + 1) // 2)
        return lean_activation(x, self.compression.derivative)


LEAN_TYPES = (nn.GELU, nn.SiLU)
"""Module types that ``lean_activations=True`` converts to :class:`LeanDerivative`."""


def _derivative_kind(module: nn.Module) -> str:
    """Which derivative table a GELU / SiLU module needs."""
    if isinstance(module, nn.SiLU):
        return 'silu'
    return 'gelu_tanh' if module.approximate == 'tanh' else 'gelu'


_SWAP = ClassSwap('Compressed')


def _selected(module: nn.Module, name: str, types: Sequence[type | str],
              names: Sequence[str] | None) -> bool:
    if names is not None:
        return any(matches(name, pattern) for pattern in names)
    return any(type(module).__name__ == t if isinstance(t, str) else isinstance(module, t)
               for t in types)


def compressible_modules(model: nn.Module, types: Sequence[type | str] = DEFAULT_TYPES,
                         names: Sequence[str] | None = None) -> list[str]:
    """The names of the modules :func:`~.config.compress_activations` would convert (outermost
    first; a module inside a chosen one, or already converted, is left out).

    Example:
        >>> from torch import nn
        >>> compressible_modules(nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.ReLU()))
        ['1']
    """
    chosen: list[str] = []
    taken: list[str] = []  # chosen now or converted before
    for name, module in model.named_modules():
        if not name or any(name.startswith(done + '.') for done in taken):
            continue
        if isinstance(module, CompressedActivations):
            taken.append(name)
        elif _selected(module, name, types, names):
            chosen.append(name)
            taken.append(name)
    return chosen


def convert_modules(model: nn.Module, bits: int, types: Sequence[type | str],
                    names: Sequence[str] | None, lean_activations: bool) -> list[str]:
    """Convert ``model``'s chosen modules in place, with values a
    :class:`~.config.CompressionConfig` checked; return their names.

    Raises:
        ConfigError: If no module matches.
    """
    converted = compressible_modules(model, types, names)
    for name in converted:
        module = model.get_submodule(name)
        derivative = None
        if lean_activations and isinstance(module, LEAN_TYPES):
            derivative = _derivative_kind(module)
            derivative_table(derivative)  # built here, not inside the first training step
        if derivative is None:
            _SWAP.swap_in(module, CompressedActivations)
        else:
            _SWAP.swap_in(module, LeanDerivative, prefix='Lean')
        module.compression = Compression(name, bits, derivative)
    if not converted:
        what = f'names {list(names)}' if names is not None else 'the module types ' + \
            ', '.join(t if isinstance(t, str) else t.__name__ for t in types)
        raise ConfigError(f'compressed activations found no module of {type(model).__name__} '
                          f'matching {what}: give types= or names=')
    return converted


def restore_activations(model: nn.Module) -> list[str]:
    """Undo :func:`~.config.compress_activations` in place; return the names of the restored
    modules."""
    restored = []
    for name, module in model.named_modules():
        if isinstance(module, CompressedActivations):
            _SWAP.swap_out(module)
            del module.compression
            restored.append(name)
    return restored
