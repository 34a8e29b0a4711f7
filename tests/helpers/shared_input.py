"""A model whose blocks each take, beside the one before's output, one tensor they all share
(as every DETR decoder layer takes the encoder's output)."""
from __future__ import annotations

import torch
from torch import nn


class _Cross(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.mix = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        return x + self.mix(torch.cat([x, memory], dim=-1)).relu()


class SharedInput(nn.Module):
    """A stem, an encoder whose output ``memory`` every block takes, ``depth`` blocks called as
    ``block(x, memory)`` (``blocks.0`` ..), and a head."""

    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.stem, self.encoder = nn.Linear(width, width), nn.Linear(width, width)
        self.blocks = nn.ModuleList(_Cross(width) for _ in range(depth))
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        memory = self.encoder(x)
        x = self.stem(x)
        for block in self.blocks:
            x = block(x, memory)
        return self.head(x)
