"""A model that calls its blocks in a loop, each given the one before's output by keyword (as
an mmdet DETR layer takes ``query=``): torch's checkpoint saves no positional tensor of such a
block."""
from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn


class KeywordLoop(nn.Module):
    """``blocks`` (an ``nn.ModuleList``) called one after another as ``block(**{keyword: x})``."""

    def __init__(self, blocks: Iterable[nn.Module], keyword: str) -> None:
        super().__init__()
        self.blocks, self.keyword = nn.ModuleList(blocks), keyword

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(**{self.keyword: x})
        return x
