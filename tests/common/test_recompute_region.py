"""Which checkpoint pass is running: our marks, and ``torch.utils.checkpoint``'s own passes told
by the saved-tensor hooks on top of autograd's stack."""
from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from torch import nn

from mmdropit.checkpoint.apply import checkpoint_module
from mmdropit.common.recompute_region import (checkpoint_pass, in_plain_checkpoint,
                                              in_recomputation, in_recomputed_region,
                                              saved_tensors_dropped)


def _pass() -> str:
    if saved_tensors_dropped():
        return 'dropped'
    return 'recomputation' if in_recomputation() else 'kept'


@pytest.mark.parametrize('reentrant', [False, True])
def test_torchs_own_checkpoint_passes_are_told(reentrant):
    """Non-reentrant: the first pass drops what is saved, the recomputation keeps it (a plain
    checkpoint's passes). Reentrant: the first pass runs without autograd, and neither is
    marked."""
    seen = []

    def region(x: torch.Tensor) -> torch.Tensor:
        seen.append((_pass(), in_plain_checkpoint()))
        return x.sin()

    x = torch.randn(4, requires_grad=True)
    checkpoint(region, x, use_reentrant=reentrant).sum().backward()
    if reentrant:
        assert seen == [('kept', False), ('kept', False)]
    else:
        assert seen == [('dropped', True), ('recomputation', True)]
    assert (_pass(), in_plain_checkpoint()) == ('kept', False)


def test_the_innermost_checkpoint_decides():
    """A mark made inside torch's checkpoint (as our checkpoints make theirs: a selective one's
    passes are kept) holds while the hooks it found stay on top; a checkpoint called inside it
    is the innermost until it returns, in the outer one's first pass and in its recomputation
    alike."""
    seen = []

    def inner(x: torch.Tensor) -> torch.Tensor:
        seen.append(('inner', _pass()))
        return x.sin()

    def outer(x: torch.Tensor) -> torch.Tensor:
        with checkpoint_pass(first=False):
            seen.append(('outer', _pass()))
            y = checkpoint(inner, x, use_reentrant=False)
            seen.append(('after', _pass()))
        return y.cos()

    x = torch.randn(4, requires_grad=True)
    checkpoint(outer, x, use_reentrant=False).sum().backward()
    first = [('outer', 'kept'), ('inner', 'dropped'), ('after', 'kept')]
    assert seen == first + first + [('inner', 'recomputation')]


class _Seen(nn.Module):
    """Notes, at each call, the pass and whether a checkpoint's region is marked."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.seen: list[tuple[str, bool]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append((_pass(), in_recomputed_region()))
        return self.linear(x).sin()


@pytest.mark.parametrize('selective', [False, True])
def test_our_checkpoint_marks_its_region_in_both_passes(selective):
    """The pass marks of our eager checkpoint mark its region too: inside in the first pass and
    in the recomputation, outside neither before nor after (also after a recomputation that
    torch's checkpoint stopped early by raising through the marks)."""
    module = _Seen()
    checkpoint_module(module, selective=selective)
    assert not in_recomputed_region()
    module(torch.randn(2, 4, requires_grad=True)).sum().backward()
    passes = ['kept', 'kept'] if selective else ['dropped', 'recomputation']
    assert module.seen == [(name, True) for name in passes]
    assert (_pass(), in_recomputed_region()) == ('kept', False)
