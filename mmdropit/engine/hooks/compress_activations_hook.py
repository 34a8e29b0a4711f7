"""Store what normalisation, activation and attention modules save for backward in 8, 4 or 2
bits.

Example config (with DropIT, whose kept values are then stored in 8 bits too)::

    custom_imports = dict(imports=['mmdropit'], allow_failed_imports=False)
    custom_hooks = [
        dict(type='DropITHook', gamma=0.9, value_bits=8),
        dict(type='CompressActivationsHook', bits=8),
    ]

With adaptive bits (GACT), 4 bits on average, chosen per layer on the first batch::

    custom_hooks = [
        dict(type='DropITHook', gamma=0.9, value_bits=4),
        dict(type='CompressActivationsHook', bits=4, adaptive_bits=True),
    ]
"""
from __future__ import annotations

from collections.abc import Sequence

from mmengine.dist import broadcast_object_list
from mmengine.registry import HOOKS

from ...codecs import AppliedCompression, CompressionConfig
from ...dropit import audit
from ...dropit.adaptive_bits import adapt_bits, set_bits
from ...errors import ConfigError
from ..runner_model import batch_loss, unwrap
from .summary import SummaryHook


def _widths_text(bits: dict[str, int]) -> str:
    """How many places store codes at each width (``bits``: the width of each place), e.g.
    ``'3 slots at 2 bits, 5 slots at 4 bits'``."""
    widths = sorted(bits.values())
    return ', '.join(f'{widths.count(b)} slots at {b} bits' for b in sorted(set(widths)))


@HOOKS.register_module()
class CompressActivationsHook(SummaryHook):
    """Convert the model's chosen modules with :func:`mmdropit.codecs.compress_activations`
    before training starts.

    The conversion is in place and keeps Parameters, buffers and ``state_dict`` keys, so
    optimizers, DDP, ``load_from`` and ``resume`` are unaffected, and checkpoints load with or
    without it. Priority ``VERY_HIGH``, as ``DropITHook``, so ``EMAHook`` copies the converted
    model.

    Under ``compile=True`` the converted modules' hooks break the compiled graph at each of
    them and run between the graphs; inside a checkpoint that dynamo traces they store nothing
    as codes (the compiled backward recomputes the region).

    Args:
        bits: 8 (int8 with a float32 scale per 32 values), 4 or 2 (a float32 minimum and step
            per 32 values, stochastic rounding).
        types: Class names of the modules to convert (e.g. ``['LayerNorm', 'GELU']``);
            ``None``: normalisation layers, GELU, SiLU, Softmax and ``Attention`` modules.
        names: Name patterns of modules to convert instead of ``types``.
        lean_activations: GELU and SiLU modules save 4-bit codes of their derivative instead
            of their quantized input (0.125 of an fp32 input; the gradient is that of a
            16-piece constant derivative).
        audit: Before training, run one forward pass on the first training batch and log, per
            converted module's saved tensor, the bytes it really freed and what keeps a dense
            copy alive (:func:`mmdropit.audit`; with ``DropITHook(audit=True)`` its audit
            lists both).
        adaptive_bits: Before the first training step, measure on its batch how much each
            place storing codes (these modules, and DropIT layers with ``value_bits``) adds to
            the gradient's error, and give each 8, 4 or 2 bits so that the codes take no more
            bytes than the configured widths with the least error
            (:func:`mmdropit.dropit.adapt_bits`; one extra step per such place). Under
            ``torch.distributed`` rank 0's choice is used by every rank.
        adapt_interval: With ``adaptive_bits``, measure and choose again every this many
            iterations (``None``: once).
    """

    priority = 'VERY_HIGH'

    def __init__(self, bits: int = 8, types: Sequence[str] | None = None,
                 names: Sequence[str] | None = None, lean_activations: bool = False,
                 audit: bool = False, adaptive_bits: bool = False,
                 adapt_interval: int | None = None) -> None:
        if adapt_interval is not None and (not adaptive_bits or isinstance(adapt_interval, bool)
                                           or not isinstance(adapt_interval, int)
                                           or adapt_interval < 1):
            raise ConfigError('CompressActivationsHook adapt_interval takes a positive number '
                              f'of iterations, with adaptive_bits=True; got {adapt_interval!r}')
        self.config = CompressionConfig(bits, types, names, lean_activations,
                                        where='CompressActivationsHook')
        self.audit = audit
        self.adaptive_bits = adaptive_bits
        self.adapt_interval = adapt_interval
        self._adapted = False
        self._configured: dict[str, int] = {}
        self._chosen: dict[str, int] = {}
        self._applied: AppliedCompression | None = None

    def before_run(self, runner) -> None:
        self._applied = self.config.apply(unwrap(runner.model))
        converted = self._applied.converted
        runner.logger.info(f'Compressed activations ({self.config.bits}-bit) in {len(converted)} '
                           f'modules: {", ".join(converted[:6])}'
                           + (', ...' if len(converted) > 6 else ''))

    def before_train(self, runner) -> None:
        if not self.audit:
            return
        model = unwrap(runner.model)
        report = audit(model, batch_loss(model, next(iter(runner.train_dataloader)),
                                         lambda: runner.optim_wrapper.optim_context(model)))
        runner.logger.info(f'Compressed activations audit (one forward pass of the first '
                           f'batch):\n{report}')

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        if not self.adaptive_bits or data_batch is None:
            return
        due = self.adapt_interval is not None and runner.iter % self.adapt_interval == 0
        if self._adapted and not due:
            return
        model = unwrap(runner.model)
        if self._configured:  # each measurement starts from the configured widths
            set_bits(model, self._configured)
        allocation = adapt_bits(model, batch_loss(
            model, data_batch, lambda: runner.optim_wrapper.optim_context(model)))
        chosen = [allocation.chosen]
        broadcast_object_list(chosen, src=0)
        self._chosen = chosen[0]
        set_bits(model, self._chosen)
        if not self._adapted:
            self._configured = {slot.name: slot.configured_bits for slot in allocation.slots}
            runner.logger.info(f'Adaptive bits, measured on the first batch:\n'
                               f'{allocation.table()}')
        else:
            runner.logger.info(f'Adaptive bits re-measured at iteration {runner.iter}: '
                               f'{_widths_text(self._chosen)}')
        self._adapted = True

    def summary(self, runner) -> str:
        adapted = (f'; adaptive bits chose {_widths_text(self._chosen)}' if self._chosen
                   else '')
        return f'{self._applied.summary} ({self.config.bits}-bit){adapted}'
