"""Activation offload (pure PyTorch): what chosen modules save for backward is kept in pinned
host memory, copied off the GPU on a side stream and prefetched back one group ahead.

- :class:`HostCopies` (:mod:`mmdropit.common.host_copies`, shared with checkpoint plans that
  keep their inputs in host memory): the saved-tensor hooks, their side stream and
  statistics (:class:`OffloadStats`);
- :class:`OffloadConfig` (:mod:`.config`): the technique's configuration, checked once and
  applied in one call (by name, or by a share of the saved bytes chosen on a forward pass);
- :func:`offload_activations`, :func:`restore_offload`, :func:`modules_holding_share`,
  :func:`block_patterns` (:mod:`.modules`): put it on a model's modules, take it off, choose
  the modules that hold a share of a step's saved bytes among the model's blocks, no more than
  the host link moves while a forward pass runs (:func:`link_bytes_per_second`, :mod:`.link`).

On a machine without a GPU nothing moves (CPU tensors stay where they are).

Example:
    >>> from torch import nn
    >>> net = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    >>> offload_activations(net, ['0']).method
    'prefetch'
"""
import torch  # noqa: F401  (the doctest's namespace)

from ..common.host_copies import MIN_BYTES, HostCopies, OffloadStats
from .config import OffloadConfig
from .link import host_link, link_bytes_per_second
from .modules import (METHODS, Offload, block_patterns, modules_holding_share,
                      offload_activations, restore_offload)

__all__ = ['METHODS', 'MIN_BYTES', 'HostCopies', 'Offload', 'OffloadConfig', 'OffloadStats',
           'block_patterns', 'host_link', 'link_bytes_per_second', 'modules_holding_share',
           'offload_activations', 'restore_offload']
