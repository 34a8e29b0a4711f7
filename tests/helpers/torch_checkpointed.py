"""A module run under ``torch.utils.checkpoint``, as models checkpoint their own blocks: timm's
``set_grad_checkpointing()`` (non-reentrant) and OpenMMLab's ``with_cp=True`` (reentrant, this
torch's default where the caller names none)."""
from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class TorchCheckpointed(nn.Module):
    """``module`` under ``torch.utils.checkpoint``: no mark of ours, only torch's hooks (a
    reentrant checkpoint gives the parameters inside gradients only for an input that needs
    one)."""

    def __init__(self, module: nn.Module, reentrant: bool = False) -> None:
        super().__init__()
        self.module, self.reentrant = module, reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.module, x, use_reentrant=self.reentrant)
