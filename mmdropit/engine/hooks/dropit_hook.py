"""Turn DropIT on for an MMEngine training run.

Example config::

    custom_imports = dict(imports=['mmdropit'], allow_failed_imports=False)
    custom_hooks = [
        dict(type='DropITHook', gamma=0.9, strategy='mink',
             exclude=['patch_embed.proj', 'head'], warmup_iters=0, audit=True),
    ]
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from mmengine.registry import HOOKS
from torch import nn

from ...common.random_source import reseed
from ...dropit import ConversionReport, DropITConfig, audit, keep_ratio, set_gamma_scale
from ...errors import ConfigError
from ..runner_model import batch_loss, compiles_model, unwrap
from .summary import SummaryHook


@HOOKS.register_module()
class DropITHook(SummaryHook):
    """Convert the model's Linear / Conv layers to DropIT layers before training starts.

    The conversion happens in ``before_run``, in place: Parameters, buffers and ``state_dict``
    keys stay the same, so the optimizer built before it, a DDP wrapper, ``load_from`` and
    ``resume`` all keep working, and a checkpoint saved with DropIT loads without it and vice
    versa. The hook runs at priority ``VERY_HIGH`` so that ``EMAHook`` (which copies the model
    in its own ``before_run``) copies the converted model. Under Runner or FlexibleRunner,
    wrapped (DDP) or not.

    Logged: the conversion (how many layers, which were left exact), at every iteration
    ``dropit_keep_ratio``, the share of saved-input elements the DropIT layers kept, and after
    the first iteration both in one line starting ``mmdropit: DropITHook:``.

    Args:
        gamma: Share of each saved input to drop, in ``[0, 1)``, or ``{pattern: gamma}``.
        strategy: ``'mink'``, ``'mink_approx'`` or ``'random'``.
        layers: Name patterns of the layers to convert (``None``: all supported layers).
        exclude: Name patterns to leave exact (``None``: the first layer and the
            classifier / box-predictor layers, as in the paper).
        lean_activations: Make ReLU / ReLU6 / LeakyReLU keep a 1-bit mask (default ``True``).
        warmup_iters: Ramp gamma linearly from 0 to its value over this many iterations.
        value_bits: 8 keeps the kept values as int8 with a scale per 32 values, 4 or 2 with
            a minimum and step per 32 values (stochastic rounding); ``None`` (default) in the
            input's dtype.
        audit: Before training, run one forward pass on the first training batch and log, per
            DropIT layer, the bytes it really freed and what keeps a dense input alive.

    Attributes:
        converted: The names of the converted layers.
        keep_ratio: ``dropit_keep_ratio`` of the last iteration (``None`` before the first).
    """

    priority = 'VERY_HIGH'

    def __init__(self, gamma: float | Mapping[str, float] = 0.9, strategy: str = 'mink',
                 layers: Sequence[str] | None = None, exclude: Sequence[str] | None = None,
                 lean_activations: bool = True, warmup_iters: int = 0,
                 audit: bool = False, value_bits: int | None = None) -> None:
        self.config = DropITConfig(gamma, strategy, layers, exclude, lean_activations,
                                   value_bits, where='DropITHook')
        if isinstance(warmup_iters, bool) or not isinstance(warmup_iters, int) \
                or warmup_iters < 0:
            raise ConfigError(f'DropITHook warmup_iters must be an int >= 0, got {warmup_iters!r}')
        self.warmup_iters = warmup_iters
        self.audit = audit
        self.converted: list[str] = []
        self.keep_ratio: float | None = None
        self._report: ConversionReport | None = None

    @property
    def gamma(self) -> float | Mapping[str, float]:
        """The configured gamma (one value or ``{pattern: gamma}``)."""
        return self.config.gammas

    @property
    def strategy(self) -> str:
        """The configured strategy."""
        return self.config.strategy

    def apply(self, model: nn.Module) -> ConversionReport:
        """Convert ``model`` (unwrapped first) with this hook's configuration."""
        report = self.config.apply(unwrap(model)).report
        self.converted = report.layers
        self._report = report
        return report

    def before_run(self, runner) -> None:
        if self.warmup_iters and compiles_model(runner):
            raise ConfigError('DropITHook warmup_iters changes gamma every iteration, and a '
                              'compiled step is compiled again for each value: set '
                              'warmup_iters=0, or train without compile')
        reseed()  # DropIT's generator: seeded from this run's seed at its first use
        report = self.apply(runner.model)
        runner.logger.info(f'{self._conversion()}. Left exact: '
                           f'{", ".join(report.excluded + report.frozen) or "none"}')

    def before_train(self, runner) -> None:
        if not self.audit:
            return
        model = unwrap(runner.model)
        batch = next(iter(runner.train_dataloader))
        report = audit(model, batch_loss(model, batch,
                                         lambda: runner.optim_wrapper.optim_context(model)))
        keep_ratio(model, reset=True)  # the audit's forward is not training
        runner.logger.info(f'DropIT audit (one forward pass of the first batch):\n{report}')

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        if self.warmup_iters:
            scale = min(1.0, (runner.iter + 1) / self.warmup_iters)
            set_gamma_scale(unwrap(runner.model), scale)

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        self.keep_ratio = keep_ratio(unwrap(runner.model), reset=True)
        if self.keep_ratio is not None:
            runner.message_hub.update_scalar('train/dropit_keep_ratio', self.keep_ratio)
        super().after_train_iter(runner, batch_idx, data_batch, outputs)

    def summary(self, runner) -> str:
        kept = ('' if self.keep_ratio is None
                else f'; the first iteration kept {self.keep_ratio:.3f} of the saved inputs')
        return self._conversion() + kept

    def _conversion(self) -> str:
        """What :meth:`apply` converted, and with which settings."""
        return f'{self._report} (gamma {self.gamma}, strategy {self.strategy!r})'

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        checkpoint.setdefault('meta', {})['dropit'] = dict(
            gamma=self.gamma, strategy=self.strategy, layers=len(self.converted))

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        saved = checkpoint.get('meta', {}).get('dropit')
        if saved is None:
            runner.logger.info('The loaded checkpoint was trained without DropIT; its weights '
                               'load unchanged (DropIT keeps every state_dict key) and training '
                               f'continues with DropIT gamma {self.gamma}.')
        elif saved.get('gamma') != self.gamma or saved.get('strategy') != self.strategy:
            runner.logger.info(f'The loaded checkpoint was trained with DropIT {saved}; '
                               f'training continues with gamma {self.gamma}, '
                               f'strategy {self.strategy!r}.')
