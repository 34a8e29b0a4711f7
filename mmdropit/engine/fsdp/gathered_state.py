"""Gather a sharded model's full state once, for a checkpoint that one process writes.

Both sharding wrappers make the inner module's ``state_dict()`` return full tensors, which is a
collective. ``Runner.save_checkpoint`` runs on rank 0 only, so :class:`FullyShardCheckpointHook`
has every rank gather first, inside :meth:`GatheredState.gathered_state`; rank 0's
``state_dict()`` then returns the gathered copy without communicating.

Example::

    with model.gathered_state():       # every rank
        if rank == 0:
            torch.save(model.module.state_dict(), path)
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class GatheredState:
    """Mixin for a wrapper whose ``module.state_dict()`` gathers shards; its state-dict hook
    returns ``_gathered`` while it is set."""

    _gathered: dict | None = None

    @contextmanager
    def gathered_state(self) -> Iterator[dict]:
        """Gather the full model state on every rank once (a collective); inside the context,
        the inner module's ``state_dict()`` returns it without communicating."""
        self._gathered = self.module.state_dict()
        try:
            yield self._gathered
        finally:
            self._gathered = None
