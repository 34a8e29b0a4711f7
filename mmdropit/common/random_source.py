"""The plugin's own random numbers, apart from the global generator.

DropIT's ``mink`` on large inputs and ``mink_approx`` sample elements to find their threshold,
``random`` draws its keep mask, and the 4- and 2-bit codecs round stochastically. Drawn from
PyTorch's global generator, those numbers would shift every later draw of the step: a DropIT
run's dropout and drop-path masks would differ from the baseline's at the same seed, which adds
noise to every paired comparison of the two. They are therefore drawn from a generator of the
plugin's own, one per device, created at its first use and seeded from ``torch.initial_seed()``
(the seed of the run, e.g. MMEngine's ``randomness.seed``), so a run stays reproducible and the
global stream is left as the baseline's. :func:`reseed` starts it afresh.

Example:
    >>> _ = torch.manual_seed(0)
    >>> before = torch.get_rng_state()
    >>> _ = torch.randint(0, 10, (4,), generator=generator(torch.device('cpu')))
    >>> torch.equal(torch.get_rng_state(), before)   # the global stream did not move
    True
"""
from __future__ import annotations

import torch

_GENERATORS: dict[torch.device, torch.Generator] = {}
_OFFSET = 0x5D_0917  # the plugin's stream differs from one seeded with the run's seed itself
_seed: int | None = None  # set by reseed(seed); else the run's seed


def generator(device: torch.device) -> torch.Generator:
    """The plugin's generator for ``device``, created and seeded at its first use (a draw made
    now takes it through :func:`capturable`)."""
    if device.type == 'cuda' and device.index is None:
        device = torch.device('cuda', torch.cuda.current_device())
    found = _GENERATORS.get(device)
    if found is None:
        seed = torch.initial_seed() if _seed is None else _seed
        found = torch.Generator(device).manual_seed(seed + _OFFSET)
        _GENERATORS[device] = found
    return found


def capturable(draw: torch.Generator | None) -> torch.Generator | None:
    """``draw``, or, while the current CUDA stream captures a graph, the default generator of
    ``draw``'s device, which every capture registers. A graph replays a generator's draws with
    new numbers only if the generator was registered with it before its capture (torch 2.11:
    an unregistered one fails the capture, "Attempt to increase offset for a CUDA generator not
    in capture mode"), and no capture (``torch.cuda.graph``, ``torch.compile``'s
    ``reduce-overhead``) knows of the plugin's. So a captured step's draws move the global
    stream, as its dropout's do. Called where the draw runs (inside the operators), not where a
    compiled step is traced."""
    if draw is None or draw.device.type != 'cuda' or not torch.cuda.is_current_stream_capturing():
        return draw
    return torch.cuda.default_generators[draw.device.index]


def device_seed(device: torch.device, draw: torch.Generator | None) -> torch.Tensor:
    """A 64-bit seed drawn on ``device`` from ``draw`` (the default generator without it;
    :func:`capturable`), as a one-element int64 tensor there: nothing is read back."""
    return torch.randint(-2**63, 2**63 - 1, (1,), generator=capturable(draw), device=device)


def reseed(seed: int | None = None) -> None:
    """Start the plugin's generators afresh, each from ``seed`` (or, without it, from
    ``torch.initial_seed()``) at its next use."""
    global _seed
    _seed = seed
    _GENERATORS.clear()
