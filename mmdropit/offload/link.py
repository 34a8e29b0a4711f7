"""How fast the host link copies: what activation offload can move while a forward pass runs.

Offloaded tensors travel to pinned host memory on a side stream while the forward pass goes on,
and back ahead of the backward pass; more bytes than the link moves in a forward pass's time
come out of the step's time. :func:`link_bytes_per_second` measures the link once per device
(the slower of the two directions); :func:`~.modules.modules_holding_share` offloads no more
than that hides.

Example:
    >>> link_bytes_per_second(torch.device('cpu')), host_link(torch.device('cpu'))  # no copies
    (inf, None)
"""
from __future__ import annotations

import functools
import math

import torch

COPY_BYTES = 64 * 2**20
"""Bytes of the copies the link is timed with."""
ROUNDS = 3
"""Timed copies each way after a warm-up one (the fastest counts)."""


@functools.cache
def link_bytes_per_second(device: torch.device) -> float:
    """Bytes a second between pinned host memory and ``device``, the slower direction (``inf``
    for a device that is not a GPU: its tensors never move)."""
    if device.type != 'cuda':
        return math.inf
    host = torch.empty(COPY_BYTES, dtype=torch.uint8, pin_memory=True)
    on_device = torch.empty(COPY_BYTES, dtype=torch.uint8, device=device)
    stream = torch.cuda.Stream(device)
    directions = ((on_device, host), (host, on_device))
    fastest = [math.inf, math.inf]
    with torch.cuda.stream(stream):
        for round_ in range(ROUNDS + 1):
            for index, (target, source) in enumerate(directions):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                    enable_timing=True)
                start.record(stream)
                target.copy_(source, non_blocking=True)
                end.record(stream)
                end.synchronize()
                if round_:
                    fastest[index] = min(fastest[index], start.elapsed_time(end) / 1000)
    return COPY_BYTES / max(fastest)


def host_link(device: torch.device) -> float | None:
    """:func:`link_bytes_per_second` where tensors on ``device`` move to host memory (a GPU),
    ``None`` where they stay (the arguments that limit copies to the link take ``None`` for no
    limit)."""
    link = link_bytes_per_second(device)
    return link if math.isfinite(link) else None
