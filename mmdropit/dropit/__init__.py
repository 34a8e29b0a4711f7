"""DropIT (pure PyTorch): layers that save only the largest-magnitude part of their input.

Chen et al., "DropIT: Dropping Intermediate Tensors for Memory-Efficient DNN Training", ICLR 2023.
A DropIT layer drops the ``gamma`` share of smallest-magnitude elements of the input it keeps for
backward and stores the rest compactly; the weight gradient is computed from that sparse input,
the input and bias gradients stay exact. Lean activations (ReLU & co. keeping a 1-bit mask) make
sure nothing else keeps the dense input alive.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from mmdropit.dropit import from_dropit, keep_ratio, to_dropit
    >>> net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
    ...                     nn.Linear(256, 10))
    >>> net = to_dropit(net, gamma=0.9, exclude=[])
    >>> net(torch.randn(32, 64)).sum().backward()
    >>> round(keep_ratio(net), 2)
    0.1
    >>> net = from_dropit(net)
"""
from .adaptive_bits import BitsAllocation, BitsSlot, adapt_bits, set_bits
from .audit import AuditReport, LayerAudit, audit
from .compact import compress, decompress, encoded_bytes, pack_bits, unpack_bits
from .config import AppliedDropIT, DropITConfig, to_dropit
from ..common.name_patterns import matches
from .convert import (PREDICTOR_PATTERNS, ConversionReport, default_exclude, dropit_layers,
                      from_dropit, keep_ratio, set_gamma_scale)
from .functional import DropITConvFunction, DropITLinearFunction, dropit_conv, dropit_linear
from .layout import CompactLayout
from .layers import DROPIT_TYPES, LEAN_ACTIVATION_TYPES, is_converted, is_dropit_layer
from .lean_activations import lean_hardtanh, lean_leaky_relu, lean_relu
from .state import DropITState
from .strategies import STRATEGIES, check_gamma, check_strategy, select

__all__ = [
    'AppliedDropIT', 'AuditReport', 'BitsAllocation', 'BitsSlot', 'CompactLayout',
    'ConversionReport', 'DROPIT_TYPES', 'DropITConfig', 'DropITConvFunction',
    'DropITLinearFunction', 'DropITState', 'LEAN_ACTIVATION_TYPES', 'LayerAudit',
    'PREDICTOR_PATTERNS', 'STRATEGIES', 'adapt_bits', 'audit', 'check_gamma', 'check_strategy',
    'compress', 'decompress', 'default_exclude', 'dropit_conv', 'dropit_layers', 'dropit_linear',
    'encoded_bytes', 'from_dropit', 'is_converted', 'is_dropit_layer', 'keep_ratio',
    'lean_hardtanh', 'lean_leaky_relu', 'lean_relu', 'matches', 'pack_bits', 'select',
    'set_bits', 'set_gamma_scale', 'to_dropit', 'unpack_bits',
]
