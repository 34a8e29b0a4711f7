"""The host time a DropIT layer adds to a training step, and the operators it runs.

On a GPU a small or mid-sized step is often host-bound: the GPU waits for Python to launch the
next kernel, and every microsecond of a layer's Python path and every launch it makes is step
time (docs/benchmarks.md, GPU section). This measures that cost on the CPU, where it can be
measured without a GPU: one thread, tiny tensors (a batch of 4 x 16 features by default), so
the arithmetic is negligible and what is timed is the host's work.

The model is a stack of ``blocks`` Linear + GELU blocks (``--layer conv``: 3x3 convolution +
ReLU blocks of ``features`` channels on a ``batch x features x 4 x 4`` input, a host-bound
ResNet's layers in small, whose ReLUs DropIT makes lean activations); a training step is its
forward pass, the sum of its output and the backward pass (no optimizer; gradients are set to
``None`` between steps, outside the timer). The plain stack runs beside the same stack
converted with ``DropITConfig(gamma, strategy, exclude=[]).apply`` (every Linear or
convolution a DropIT layer), for each strategy, with DropIT's fused kernels and on its eager
path (:func:`~mmdropit.kernels.switch.eager_only`), and for the strategies a DropIT layer runs
as its C++ autograd node, on the fused kernels as the Python Functions too
(:func:`~mmdropit.kernels.switch.without_nodes`: what the nodes save). The variants alternate
within each round (their order rotating), so that a load from other jobs falls on all of
them; each round times ``steps`` steps of each, and the table gives the minimum and the median
over the rounds:

- ``us/step``: host time of a step;
- ``+us/layer``: what a DropIT layer adds over the plain block (minimum: minimum over
  minimum; median: the median over rounds of the round's difference);
- ``x plain``: the step's time as a multiple of the plain stack's (same two statistics);
- ``ops fwd`` / ``ops bwd``: operators one layer runs in its forward and backward pass, a
  proxy for the kernel launches a GPU would make (counted by the legacy autograd profiler,
  which changes no code path: ATen operators and the fused kernels' operators, each once;
  views, allocations and other metadata-only operators not counted; composite operators such
  as ``linear`` or ``matmul`` counted by what they run). On a GPU the Triton ``keep_topk``
  is several launches where this counts one (docs/dropit.md);
- ``syncs``: operators among those that wait for the device on a GPU (``item``, ``nonzero``,
  ``masked_select``, ...), forward and backward together.

With the default 4 x 16 input (64 elements, far under the 65,536-element sample),
``mink_approx`` runs the exact ``mink`` selection, as the strategy says for small inputs.

``--device cuda`` runs the same on a GPU, where the tiny step is host-bound: its time is the
host's, launches included (a round ends with a synchronisation, outside the timer).

Run ``python -m mmdropit.bench.host_cost`` (``--json PATH`` writes the table and the run's
provenance; ``--help`` for the sizes).

Example:
    >>> counts = count_layer_ops(None, fused=True, batch=2, features=4)
    >>> counts.forward, counts.backward, counts.syncs
    (1, 3, 0)
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.autograd.profiler_legacy import profile as legacy_profile

from ..dropit.config import DropITConfig
from ..dropit.ops import NODE_STRATEGIES
from ..dropit.strategies import STRATEGIES
from ..kernels.switch import eager_only, without_nodes
from ..reporting.provenance import provenance

NOT_LAUNCHING = frozenset({
    'aten::_reshape_alias', 'aten::_unsafe_view', 'aten::alias', 'aten::as_strided',
    'aten::as_strided_', 'aten::detach', 'aten::empty', 'aten::empty_like',
    'aten::empty_strided', 'aten::expand', 'aten::lift_fresh', 'aten::new_empty',
    'aten::new_empty_strided', 'aten::permute', 'aten::resize_', 'aten::resolve_conj',
    'aten::resolve_neg', 'aten::select', 'aten::set_', 'aten::slice', 'aten::squeeze',
    'aten::squeeze_', 'aten::t', 'aten::transpose', 'aten::unsqueeze', 'aten::unsqueeze_',
    'aten::view', 'aten::view_as', 'detach'})
"""Operators that only make views, allocate or change metadata: no kernel launch on a GPU."""
COMPOSITE = frozenset({
    'aten::contiguous', 'aten::flatten', 'aten::full', 'aten::item', 'aten::linear',
    'aten::matmul', 'aten::new_full', 'aten::new_zeros', 'aten::ones_like', 'aten::reshape',
    'aten::zeros', 'aten::zeros_like', 'mmdropit_cpu::dropit_linear',
    'mmdropit_cpu::dropit_conv'})
"""Operators counted by what they run (``linear`` is ``t`` and ``addmm``; ``reshape`` a view
or a copy; ``zeros`` an allocation and a fill; DropIT's C++ nodes their selection and GEMM
or convolution)."""
SYNCING = frozenset({
    'aten::_local_scalar_dense', 'aten::is_nonzero', 'aten::masked_select', 'aten::nonzero',
    'aten::unique_consecutive', 'aten::_unique2', 'aten::equal'})
"""Operators that wait for the device on a GPU (a value or a data-dependent size read back)."""


@dataclass(frozen=True)
class OpCounts:
    """Operators one layer runs (launches on a GPU, roughly) and how many of them sync."""

    forward: int
    backward: int
    syncs: int
    forward_names: tuple[str, ...] = field(default=(), compare=False)
    backward_names: tuple[str, ...] = field(default=(), compare=False)


def _launching(event) -> list[str]:
    """The operators ``event`` launches: itself, or, for a composite, what it runs."""
    name = event.name
    if name in COMPOSITE:
        return [op for child in event.cpu_children for op in _launching(child)]
    if name in NOT_LAUNCHING or not (name.startswith('aten::') or '::' in name):
        return []
    return [name]


def _syncs(event) -> int:
    return (event.name in SYNCING) + sum(_syncs(child) for child in event.cpu_children)


def _operators(events, roots) -> tuple[list[str], int]:
    """The launching operators and syncs under the events named by ``roots`` (a predicate on
    top-level events: the ops below non-operator events such as autograd nodes are counted)."""
    names: list[str] = []
    syncs = 0

    def visit(event) -> None:
        nonlocal syncs
        if event.name.startswith('aten::') or event.name.startswith('mmdropit'):
            names.extend(_launching(event))
            syncs += _syncs(event)
        else:  # a Python function, an autograd node: look inside
            for child in event.cpu_children:
                visit(child)

    for event in events:
        if event.cpu_parent is None and roots(event.name):
            visit(event)
    return names, syncs


def _backward_node(name: str) -> bool:
    return 'AccumulateGrad' not in name  # accumulating gradients: the same for every layer


def count_layer_ops(strategy: str | None, fused: bool = True, gamma: float = 0.9,
                    batch: int = 4, features: int = 16, node: bool = True,
                    device: str = 'cpu', layer_kind: str = 'linear') -> OpCounts:
    """Operators one layer of :func:`layer_of` runs on its input (:func:`input_of`),
    plain (``strategy=None``) or as a DropIT layer with ``strategy`` and ``gamma``, on the
    fused kernels or (``fused=False``) on DropIT's eager path, as its C++ node where it has one
    or (``node=False``) as the Python Function; forward, then backward from a given output
    gradient (so no loss's backward is counted)."""
    torch.manual_seed(0)
    layer = layer_of(layer_kind, features).to(device)
    if strategy is not None:
        DropITConfig(gamma=gamma, strategy=strategy, exclude=[]).apply(layer)
    x = input_of(layer_kind, batch, features, device).requires_grad_()
    grad_out = torch.randn_like(x)
    with Variant('', strategy, fused, node).context():
        layer(x).backward(grad_out)  # first use: the kernels load, caches fill
        for parameter in (x, *layer.parameters()):
            parameter.grad = None
        with legacy_profile() as forward:
            out = layer(x)
        with legacy_profile() as backward:
            out.backward(grad_out)
    forward_names, forward_syncs = _operators(forward.function_events, lambda name: True)
    backward_names, backward_syncs = _operators(backward.function_events, _backward_node)
    return OpCounts(len(forward_names), len(backward_names), forward_syncs + backward_syncs,
                    tuple(forward_names), tuple(backward_names))


@dataclass(frozen=True)
class Variant:
    """One model of the comparison: plain (``strategy`` ``None``) or DropIT."""

    name: str
    strategy: str | None = None
    fused: bool = True
    node: bool = True

    def context(self) -> contextlib.AbstractContextManager[None]:
        """What its steps run inside (:func:`eager_only` for the eager path,
        :func:`without_nodes` for the Python Function)."""
        if not self.fused:
            return eager_only()
        return contextlib.nullcontext() if self.node else without_nodes()


PLAIN = Variant('plain')


def variants(strategies: Sequence[str] = tuple(STRATEGIES)) -> list[Variant]:
    """The plain stack, then each strategy fused, fused as the Python Function (where a layer
    has a C++ node for it) and eager."""
    chosen = [PLAIN]
    for strategy in strategies:
        chosen.append(Variant(strategy, strategy))
        if strategy in NODE_STRATEGIES:
            chosen.append(Variant(f'{strategy}-function', strategy, node=False))
        chosen.append(Variant(f'{strategy}-eager', strategy, fused=False))
    return chosen


LAYER_KINDS = ('linear', 'conv')


def layer_of(kind: str, features: int) -> nn.Module:
    """``Linear(features, features)`` or a 3x3 ``Conv2d`` of ``features`` channels in and
    out, padded to keep its input's size."""
    return (nn.Conv2d(features, features, 3, padding=1) if kind == 'conv'
            else nn.Linear(features, features))


def input_shape(kind: str, batch: int, features: int) -> tuple[int, ...]:
    """The shape of :func:`layer_of`'s input: ``batch x features`` (``batch x features x 4 x
    4`` for a convolution)."""
    return (batch, features, 4, 4) if kind == 'conv' else (batch, features)


def input_of(kind: str, batch: int, features: int, device: str = 'cpu') -> torch.Tensor:
    """A random input of :func:`layer_of`'s layer (:func:`input_shape`)."""
    return torch.randn(input_shape(kind, batch, features), device=device)


def block_stack(blocks: int, features: int, seed: int = 0,
                kind: str = 'linear') -> nn.Sequential:
    """``blocks`` blocks of :func:`layer_of`'s layer and its activation (GELU after a Linear,
    an in-place ReLU after a convolution, as in a ResNet)."""
    torch.manual_seed(seed)
    return nn.Sequential(*(module for _ in range(blocks)
                           for module in (layer_of(kind, features), _activation_of(kind))))


def _activation_of(kind: str) -> nn.Module:
    return nn.ReLU(inplace=True) if kind == 'conv' else nn.GELU()


@dataclass(frozen=True)
class Settings:
    """What is measured: the stack, the input, the rounds."""

    blocks: int = 24
    batch: int = 4
    features: int = 16
    gamma: float = 0.9
    rounds: int = 15
    steps: int = 20
    warmup: int = 10
    device: str = 'cpu'
    layer: str = 'linear'


def _model(variant: Variant, settings: Settings) -> nn.Module:
    model = block_stack(settings.blocks, settings.features, kind=settings.layer).to(
        settings.device)
    if variant.strategy is not None:
        DropITConfig(gamma=settings.gamma, strategy=variant.strategy, exclude=[]).apply(model)
    return model


def _timed_steps(model: nn.Module, x: torch.Tensor, steps: int) -> float:
    """Seconds of host time a step takes, the mean of ``steps`` steps (on a GPU, the device
    caught up after the last, outside the timer)."""
    total = 0.0
    for _ in range(steps):
        start = time.perf_counter()
        model(x).sum().backward()
        total += time.perf_counter() - start
        for parameter in model.parameters():
            parameter.grad = None
    if x.is_cuda:
        torch.cuda.synchronize(x.device)
    return total / steps


def time_variants(chosen: Sequence[Variant], settings: Settings) -> dict[str, list[float]]:
    """Per variant, the mean host seconds of a step in each round (variants alternated);
    each round's times go to stderr as it ends (a run stopped by a time limit keeps them)."""
    models = {variant.name: _model(variant, settings) for variant in chosen}
    x = input_of(settings.layer, settings.batch, settings.features, settings.device)
    times: dict[str, list[float]] = {variant.name: [] for variant in chosen}
    for variant in chosen:
        with variant.context():
            _timed_steps(models[variant.name], x, settings.warmup)
    for round_ in range(settings.rounds):
        shift = round_ % len(chosen)
        for variant in [*chosen[shift:], *chosen[:shift]]:
            with variant.context():
                times[variant.name].append(_timed_steps(models[variant.name], x, settings.steps))
        print(f'round {round_ + 1}/{settings.rounds} (us/step): ' + ', '.join(
            f'{variant.name} {times[variant.name][-1] * 1e6:.0f}' for variant in chosen),
            file=sys.stderr, flush=True)
    return times


@dataclass
class Row:
    """One variant's line of the table."""

    variant: str
    step_us_min: float
    step_us_median: float
    added_us_per_layer_min: float
    added_us_per_layer_median: float
    ratio_min: float
    ratio_median: float
    ops_forward: int
    ops_backward: int
    syncs: int


def summarise(chosen: Sequence[Variant], times: dict[str, list[float]],
              settings: Settings) -> list[Row]:
    """The table's rows from :func:`time_variants`' times and each variant's operator counts."""
    plain = times[PLAIN.name]
    rows = []
    for variant in chosen:
        own = times[variant.name]
        counts = count_layer_ops(variant.strategy, variant.fused, settings.gamma,
                                 settings.batch, settings.features, variant.node,
                                 settings.device, settings.layer)
        added = [(mine - base) / settings.blocks for mine, base in zip(own, plain)]
        ratios = [mine / base for mine, base in zip(own, plain)]
        rows.append(Row(variant.name, min(own) * 1e6, statistics.median(own) * 1e6,
                        (min(own) - min(plain)) / settings.blocks * 1e6,
                        statistics.median(added) * 1e6, min(own) / min(plain),
                        statistics.median(ratios), counts.forward, counts.backward,
                        counts.syncs))
    return rows


def markdown(rows: Sequence[Row], settings: Settings) -> str:
    """The rows as a Markdown table (min / median per cell)."""
    layer = layer_of(settings.layer, settings.features)
    shape = 'x'.join(map(str, input_shape(settings.layer, settings.batch, settings.features)))
    lines = [f'{settings.blocks} x ({layer} + {_activation_of(settings.layer)}), '
             f'input {shape}, gamma {settings.gamma:g}, '
             f'{settings.device}, 1 thread; '
             f'{settings.rounds} rounds of {settings.steps} steps; min / median',
             '',
             '| variant | us/step | +us/layer | x plain | ops fwd | ops bwd | syncs |',
             '|---|---|---|---|---|---|---|']
    for row in rows:
        lines.append(f'| {row.variant} | {row.step_us_min:.0f} / {row.step_us_median:.0f} | '
                     f'{row.added_us_per_layer_min:.1f} / {row.added_us_per_layer_median:.1f} | '
                     f'{row.ratio_min:.2f} / {row.ratio_median:.2f} | {row.ops_forward} | '
                     f'{row.ops_backward} | {row.syncs} |')
    return '\n'.join(lines)


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run(settings: Settings, strategies: Sequence[str] = tuple(STRATEGIES)) -> list[Row]:
    """Time and count every variant (one thread) and return the table's rows."""
    chosen = variants(strategies)
    with _one_thread():
        times = time_variants(chosen, settings)
        return summarise(chosen, times, settings)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    defaults = Settings()
    for name, value in asdict(defaults).items():
        parser.add_argument(f'--{name}', type=type(value), default=value,
                            choices=LAYER_KINDS if name == 'layer' else None)
    parser.add_argument('--strategies', nargs='+', default=list(STRATEGIES),
                        choices=list(STRATEGIES))
    parser.add_argument('--json', type=Path, help='write the rows and the run here')
    args = parser.parse_args(argv)
    settings = Settings(**{name: getattr(args, name) for name in asdict(defaults)})
    rows = run(settings, args.strategies)
    print(markdown(rows, settings))
    if args.json is not None:
        with _one_thread():
            record = provenance()
        args.json.write_text(json.dumps({'run': record, 'settings': asdict(settings),
                                         'rows': [asdict(row) for row in rows]}, indent=2)
                             + '\n')


if __name__ == '__main__':
    main()
