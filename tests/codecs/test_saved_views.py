"""Saved views rebuilt with their strides: the views of one storage share one buffer of the span
they cover, a held buffer is reused only where the views fit in it, overlapping views and
contiguous tensors need no layout."""
from __future__ import annotations

import torch

from mmdropit.codecs.saved_views import ViewLayout, elements_apart


def _rebuilt(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    layouts = [ViewLayout.of(tensor) for tensor in tensors]  # all saved before any is rebuilt
    return [layout.rebuild(tensor.reshape(-1).clone())
            for layout, tensor in zip(layouts, tensors)]


def test_the_query_key_and_value_come_back_with_their_strides_in_one_buffer():
    qkv = torch.randn(2, 5, 3, 4, 6).permute(2, 0, 3, 1, 4)  # timm's attention layout
    views = list(qkv.unbind(0))
    rebuilt = _rebuilt(views)
    for view, again in zip(views, rebuilt):
        assert again.shape == view.shape and again.stride() == view.stride()
        assert torch.equal(again, view)
    storage = rebuilt[0].untyped_storage()
    assert all(again.untyped_storage() is storage for again in rebuilt)
    assert storage.nbytes() == qkv.numel() * qkv.element_size()


def test_a_slice_takes_the_span_it_reaches_and_no_more():
    rows = torch.randn(10, 64)
    middle = rows[2:6, 8:40]
    again, = _rebuilt([middle])
    assert again.stride() == middle.stride() and torch.equal(again, middle)
    assert again.untyped_storage().nbytes() == ((5 - 2) * 64 + 40 - 8) * 4


def test_a_view_saved_outside_the_held_buffer_gets_its_own():
    base = torch.randn(8, 16)
    first, = _rebuilt([base[:4, :8]])
    held = first.clone()
    second, = _rebuilt([base[4:, :8]])  # the span now covers both: the held buffer is too small
    assert second.untyped_storage() is not first.untyped_storage()
    assert torch.equal(first, held) and torch.equal(second, base[4:, :8])


def test_contiguous_and_overlapping_tensors_need_no_layout():
    assert ViewLayout.of(torch.randn(4, 8)) is None
    assert ViewLayout.of(torch.randn(4, 1).expand(4, 8)) is None
    assert ViewLayout.of(torch.randn(8, 8).as_strided((4, 4), (1, 1))) is None
    assert ViewLayout.of(torch.randn(4, 8).t()) is not None
    assert not elements_apart(torch.randn(4, 1).expand(4, 8))
    assert elements_apart(torch.randn(2, 5, 3, 4).permute(2, 0, 3, 1)[0])
