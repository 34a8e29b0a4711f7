"""Which variants a benchmark run measures, from its command line's choices
(``tools/benchmark.py``): the default set, a named list, or one of the runs of its own
(checkpoint curve, micro-batching, memory budget with its grids, frontier).

Example:
    >>> known_names('grad-ckpt, micro-4', catalogue(), 'variant')
    ['grad-ckpt', 'micro-4']
    >>> run_variants('ckpt-plan-min+bf16', frontier=True)  # its plain bf16 step comes too
    ['bf16-autocast', 'ckpt-plan-min+bf16']
    >>> 'compile+bf16' in run_variants(frontier=True), 'compile+bf16' in run_variants(
    ...     frontier=True, device='cuda')
    (False, True)
"""
from __future__ import annotations

from collections.abc import Mapping

from .frontier import REFERENCES
from .variants import (BASELINE, CURVE_VARIANTS, DEFAULT_VARIANTS, MICRO_VARIANTS, budget_run,
                       catalogue, frontier_run)


def known_names(text: str, known: Mapping[str, object], what: str) -> list[str]:
    """The comma list ``text``, each name checked against ``known``.

    Raises:
        ValueError: An unknown name, or none (the message names the choices).
    """
    names = [name.strip() for name in text.split(',') if name.strip()]
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise ValueError(f'unknown {what} {unknown or text!r}; choose from {", ".join(known)}')
    return names


def run_variants(text: str | None = None, *, budget: bool = False, grid: bool = False,
                 lossy_grid: bool = False, curve: bool = False, micro: bool = False,
                 frontier: bool = False, device: str = 'cpu', compiled: bool = False
                 ) -> list[str]:
    """The variants a run measures besides the baseline.

    Args:
        text: ``--variants``' comma list (``None``: not given). With ``frontier`` it narrows
            the frontier run to these (each precision's plain step is added).
        budget, grid, lossy_grid, curve, micro, frontier: The runs of their own.
        device: ``'cpu'`` or ``'cuda'`` (the frontier adds compile and offload on a GPU).
        compiled: The run compiles every model (``--compile``).

    Raises:
        ValueError: An unknown variant, or choices that do not go together.
    """
    if (grid or lossy_grid) and not budget:
        raise ValueError('--grid and --lossy-grid check the memory-budget planner: use them '
                         'with --budget')
    if frontier and (budget or curve or micro or compiled):
        raise ValueError('--frontier is a run of its own (its compiled points compile the '
                         'model themselves): leave out --budget, --curve, --micro and --compile')
    if budget:
        return budget_run(grid, lossy_grid)
    if curve or micro:
        return list(CURVE_VARIANTS if curve else MICRO_VARIANTS)
    variants = catalogue()
    if not frontier:
        return known_names(text or ','.join(DEFAULT_VARIANTS), variants, 'variant')
    if text is None:
        return frontier_run(device)
    names = known_names(text, variants, 'variant')
    plain = [REFERENCES[variants[name].precision] for name in names
             if REFERENCES.get(variants[name].precision, BASELINE) != BASELINE]
    return list(dict.fromkeys([*plain, *names]))
