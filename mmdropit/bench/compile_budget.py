"""Our checkpoint plans beside ``torch.compile``'s own activation memory budget.

``torch._functorch.config.activation_memory_budget`` makes the min-cut partitioner of a compiled
training graph save at most that fraction of what it would save by default, recomputing the rest
in backward (a knapsack over the graph's operators, with a flops runtime estimate). It is what a
2026 user would try first. Here it is swept against our planner, eager and compiled, on the same
model and batch.

Each :class:`Setting` runs in a process of its own (compile caches, the partitioner's global
setting and the allocator start clean), on its own model beside an eager twin built from the same
seed: the twin's steps alternate with the setting's, so each time ratio compares steps taken under
the same machine load (the median of the per-round ratios). Memory is the step's peak above its
start, measured with :class:`~mmdropit.memory.ProfiledPeakMeter` (the profiler's memory events,
which see compiled code's allocations): activations, temporaries and gradients, parameters and
optimizer state left out. On eager settings MemTracker's figure is measured beside it as a check.

Example::

    results = run_comparison(['resnet50'], batch_size=16, steps=5)
    print(comparison_markdown(results))
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch._dynamo.utils import counters

from ..common.units import mib
from ..memory import ProfiledPeakMeter, StepPeakMeter
from ..reporting import provenance
from .harness import train_step
from .models import MODELS, Builder
from .variants import BASELINE, Variant
from .workload import Workload

EAGER = 'eager'
LEAST_MEMORY = 'min'


@dataclass(frozen=True)
class Setting:
    """One configuration of the comparison.

    Attributes:
        compiled: Whether the model's forward is compiled (``torch.compile``, inductor).
        compile_budget: ``activation_memory_budget`` of the partitioner (1.0: its default).
        plan: Our planner's budget (a fraction of the unplanned activation peak), ``'min'`` for
            the least-memory plan, or ``None`` for no plan; single-level when compiled, as
            ``CheckpointPlanHook`` plans for ``compile=True``.
    """

    compiled: bool = False
    compile_budget: float = 1.0
    plan: float | str | None = None

    @property
    def name(self) -> str:
        """e.g. ``'eager'``, ``'compiled'``, ``'compile-budget-0.5'``, ``'plan-min'``,
        ``'plan-0.5+compiled'``."""
        parts = [f'plan-{self.plan}'] if self.plan is not None else []
        if self.compile_budget < 1.0:
            parts.append(f'compile-budget-{self.compile_budget}')
        elif self.compiled:
            parts.append('compiled')
        return '+'.join(parts) or EAGER

    @property
    def family(self) -> str:
        """The curve a setting belongs to: ``'compile budget'`` (compiled, no plan; the
        partitioner's default at 1.0), ``'ours, eager'`` or ``'ours, compiled'`` (the unplanned
        eager step is the common baseline)."""
        if self.plan is None:
            return 'compile budget' if self.compiled else 'baseline'
        return 'ours, compiled' if self.compiled else 'ours, eager'


COMPILE_BUDGETS = (1.0, 0.7, 0.5, 0.3, 0.0)
PLAN_BUDGETS = (LEAST_MEMORY, 0.5, 0.7)
SETTINGS = (
    Setting(),
    *(Setting(compiled=True, compile_budget=budget) for budget in COMPILE_BUDGETS),
    *(Setting(plan=plan) for plan in PLAN_BUDGETS),
    *(Setting(compiled=True, plan=plan) for plan in PLAN_BUDGETS),
)
"""What a comparison measures per model, in table order."""


@dataclass(frozen=True)
class SettingResult:
    """One setting measured on one model.

    Attributes:
        model: Model name.
        setting: :attr:`Setting.name`.
        family: :attr:`Setting.family`.
        peak_growth_bytes: The step's peak above its start (ProfiledPeakMeter).
        tracked_growth_bytes: The same from MemTracker (eager settings only, as a check).
        state_bytes: Parameters, buffers and optimizer state alive at the step's start.
        step_seconds: Median step time.
        time_ratio: Median of the per-round ratios to the eager twin's step.
        compile_seconds: The first step's time (compiling forward and backward, a plan's
            checkpoint regions included); ``None`` when eager.
        plan_seconds: Recording and search time of the plan; ``None`` without a plan.
        graphs: Graphs dynamo compiled; ``None`` when eager.
        graph_breaks: Graph breaks dynamo made; ``None`` when eager.
    """

    model: str
    setting: str
    family: str
    peak_growth_bytes: int
    tracked_growth_bytes: int | None
    state_bytes: int
    step_seconds: float
    time_ratio: float
    compile_seconds: float | None
    plan_seconds: float | None
    graphs: int | None
    graph_breaks: int | None


def _state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    tensors = [*model.parameters(), *model.buffers(),
               *(value for state in optimizer.state.values() for value in state.values()
                 if isinstance(value, torch.Tensor))]
    return sum(tensor.untyped_storage().nbytes() for tensor in tensors)


def _build(build: Builder, model: str, batch_size: int, seed: int) -> Workload:
    torch.manual_seed(seed)
    work = build(model, batch_size, torch.device('cpu'))
    work.optimizer = torch.optim.SGD(work.model.parameters(), lr=1e-4, momentum=0.9)
    return work


def measure_setting(model: str, setting: Setting, batch_size: int, steps: int,
                    seed: int = 0, build: Builder | None = None) -> SettingResult:
    """Measure ``setting`` on ``model`` in this process (the partitioner's global setting is
    changed while it runs, and compile caches stay: :func:`run_comparison` gives each setting a
    process of its own).

    Args:
        model: A name from :data:`~.models.MODELS`.
        setting: What to measure.
        batch_size: Images per step.
        steps: Timed rounds (each: one twin step and one step of the setting).
        seed: Seed of the weights and the batch (the twin gets the same).
        build: Builds the workload (default: ``MODELS[model]``).

    Returns:
        The measurement.
    """
    from torch._functorch import config as functorch_config

    from ..checkpoint import plan_checkpoints

    plain = Variant(BASELINE)
    build = build or MODELS[model]
    twin, work = (_build(build, model, batch_size, seed) for _ in range(2))
    plan_seconds = compile_seconds = graphs = breaks = tracked = None
    if setting.plan is not None:
        started = time.perf_counter()
        budget = None if setting.plan == LEAST_MEMORY else setting.plan
        plan_checkpoints(work.model, work.loss, budget,
                         nested=not setting.compiled).apply(work.model)
        plan_seconds = time.perf_counter() - started
    # the partitioner's setting is global: restored when the measurement ends
    with functorch_config.patch(activation_memory_budget=setting.compile_budget):
        if setting.compiled:
            torch._dynamo.reset()
            counters.clear()
            work.compile()
            started = time.perf_counter()
            train_step(work, plain, work.optimizer)
            compile_seconds = time.perf_counter() - started
            graphs = counters['stats']['unique_graphs']
            breaks = sum(counters['graph_break'].values())
        for each in (twin, work):
            train_step(each, plain, each.optimizer)  # warm-up; the optimizer creates its state
        state = _state_bytes(work.model, work.optimizer)
        if not setting.compiled:
            with StepPeakMeter(work.model, work.optimizer, torch.device('cpu'),
                               reset_peak=True) as tracker:
                train_step(work, plain, work.optimizer)
            tracked = tracker.result.peak_bytes - state
        with ProfiledPeakMeter() as meter:
            train_step(work, plain, work.optimizer)
        times: dict[str, list[float]] = {'twin': [], 'setting': []}
        for _ in range(steps):
            for key, each in (('twin', twin), ('setting', work)):
                started = time.perf_counter()
                train_step(each, plain, each.optimizer)
                times[key].append(time.perf_counter() - started)
    return SettingResult(
        model=model, setting=setting.name, family=setting.family,
        peak_growth_bytes=meter.result.peak_bytes, tracked_growth_bytes=tracked,
        state_bytes=state, step_seconds=statistics.median(times['setting']),
        time_ratio=statistics.median(s / t for s, t in zip(times['setting'], times['twin'])),
        compile_seconds=compile_seconds, plan_seconds=plan_seconds, graphs=graphs,
        graph_breaks=breaks)


def run_comparison(models: Sequence[str], batch_size: int, steps: int, seed: int = 0,
                   settings: Sequence[Setting] = SETTINGS) -> list[SettingResult]:
    """Measure every setting on every model, each in a fresh process; print a line per setting.

    Raises:
        RuntimeError: If a setting's process fails (with the last lines of its output).
    """
    results = []
    with tempfile.TemporaryDirectory() as folder:
        for model in models:
            for setting in settings:
                path = Path(folder) / f'{model}-{setting.name}.json'
                command = [sys.executable, '-m', __name__, '--model', model,
                           '--setting', json.dumps(asdict(setting)),
                           '--batch-size', str(batch_size), '--steps', str(steps),
                           '--seed', str(seed), '--json', str(path)]
                done = subprocess.run(command, capture_output=True, text=True)
                if done.returncode != 0:
                    tail = '\n'.join((done.stdout + done.stderr).splitlines()[-15:])
                    raise RuntimeError(f'{model} / {setting.name} failed:\n{tail}')
                result = SettingResult(**json.loads(path.read_text()))
                print(f'  {model:<12} {setting.name:<28} growth '
                      f'{mib(result.peak_growth_bytes, unit=False):>8} MiB  '
                      f'x{result.time_ratio:.2f}'
                      + (f'  compile {result.compile_seconds:.0f} s'
                         if result.compile_seconds else ''), flush=True)
                results.append(result)
    return results


def _ratio(result: SettingResult, results: Sequence[SettingResult]) -> float:
    eager = next(r for r in results if r.model == result.model and r.setting == EAGER)
    return result.peak_growth_bytes / eager.peak_growth_bytes


def comparison_markdown(results: Sequence[SettingResult]) -> str:
    """The comparison as a markdown table: memory as a ratio to the eager unplanned step."""
    lines = ['| model | setting | step peak above start | x eager | MemTracker check | '
             'step s | time x eager twin | compile s | plan s | graphs / breaks |',
             '|---|---|---|---|---|---|---|---|---|---|']
    for r in results:
        check = ('' if r.tracked_growth_bytes is None else
                 f'{r.tracked_growth_bytes / r.peak_growth_bytes:.3f}')
        seconds = [f'{value:.0f}' if value is not None else '' for value in
                   (r.compile_seconds, r.plan_seconds)]
        graphs = '' if r.graphs is None else f'{r.graphs} / {r.graph_breaks}'
        lines.append(f'| {r.model} | {r.setting} | {mib(r.peak_growth_bytes, 0)} | '
                     f'{_ratio(r, results):.2f} | {check} | {r.step_seconds:.2f} | '
                     f'{r.time_ratio:.2f} | {seconds[0]} | {seconds[1]} | {graphs} |')
    return '\n'.join(lines) + '\n'


def plot_comparison(results: Sequence[SettingResult], path: Path) -> Path:
    """Draw memory (step peak above start, x eager) against step time (x eager twin), one panel
    per model, one line per family of settings."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    models = list(dict.fromkeys(r.model for r in results))
    figure = Figure(figsize=(5.5 * len(models), 4.5), layout='constrained')
    FigureCanvasAgg(figure)
    for axes, model in zip(figure.subplots(1, len(models), squeeze=False)[0], models):
        rows = [r for r in results if r.model == model]
        for family, style in (('baseline', 'ks'), ('compile budget', 'o-'),
                              ('ours, eager', '^-'), ('ours, compiled', 'v-')):
            points = sorted((r.time_ratio, _ratio(r, rows), r.setting) for r in rows
                            if r.family == family)
            if points:
                axes.plot([p[0] for p in points], [p[1] for p in points], style, label=family)
                for x, y, name in points:
                    axes.annotate(name, (x, y), fontsize=6, xytext=(3, 3),
                                  textcoords='offset points')
        axes.set_title(model)
        axes.set_xlabel('step time (x eager)')
        axes.set_ylabel('step peak above start (x eager)')
        axes.grid(alpha=0.3)
        axes.legend(fontsize='small')
    figure.savefig(path, dpi=120)
    return path


def write_comparison(results: Sequence[SettingResult], out: Path, batch_size: int,
                     steps: int) -> str:
    """Write ``compile_budget.md``, ``compile_budget.json`` and ``compile_budget.png`` into
    ``out``; return the markdown table."""
    table = comparison_markdown(results)
    (out / 'compile_budget.md').write_text(
        f'# Checkpoint plans beside compile\'s activation memory budget\n\nBatch {batch_size}, '
        f'{steps} timed rounds alternated with an eager twin, one process per setting.\n\n'
        + table)
    (out / 'compile_budget.json').write_text(json.dumps(
        {'provenance': provenance(), 'batch_size': batch_size, 'timed_rounds': steps,
         'results': [asdict(r) for r in results]}, indent=1))
    plot_comparison(results, out / 'compile_budget.png')
    return table


def _main() -> None:
    parser = argparse.ArgumentParser(description='Measure one setting (run by run_comparison).')
    parser.add_argument('--model', required=True)
    parser.add_argument('--setting', required=True, help='a Setting as JSON')
    parser.add_argument('--batch-size', type=int, required=True)
    parser.add_argument('--steps', type=int, required=True)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--json', required=True)
    args = parser.parse_args()
    result = measure_setting(args.model, Setting(**json.loads(args.setting)), args.batch_size,
                             args.steps, args.seed)
    Path(args.json).write_text(json.dumps(asdict(result)))


if __name__ == '__main__':
    _main()
