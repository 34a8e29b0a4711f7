"""Micro-batching optim wrappers on real MMEngine models: gradients, counts, budgets, errors."""
from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator

import pytest
import torch
from mmengine.logging import MMLogger
from mmengine.model import BaseModel
from mmengine.optim import OptimWrapper
from torch import nn

from mmdropit import ConfigError
from mmdropit.engine.optim import MicroBatchOptimWrapper, MixedPrecisionOptimWrapper
from mmdropit.engine.optim.batch_split import split_batch
from mmdropit.memory.trial_peak import trial_peak
from mmdropit.microbatch import micro_batch_sizes


class _Regressor(BaseModel):
    """A small MMEngine model: MLP with a norm layer, mean squared error per sample."""

    def __init__(self, norm: type[nn.Module] = nn.LayerNorm) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 64), norm(64), nn.GELU(), nn.Dropout(0.0),
                                  nn.Linear(64, 1))

    def forward(self, inputs, targets=None, mode='loss'):
        out = self.body(torch.stack(inputs) if isinstance(inputs, list) else inputs)
        return dict(loss=(out.squeeze(1) - targets).square().mean())


@contextlib.contextmanager
def _logged() -> Iterator[list[logging.LogRecord]]:
    """The records MMEngine's current logger emits inside the block."""
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = MMLogger.get_current_instance()
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


def _batch(size: int = 12, seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return dict(inputs=list(torch.randn(size, 16, generator=generator)),
                targets=torch.randn(size, generator=generator))


def _train(model: BaseModel, wrapper: OptimWrapper, batches: list[dict],
           max_iters: int | None = None) -> list[dict]:
    wrapper.initialize_count_status(model, 0, max_iters or len(batches))
    return [model.train_step(batch, wrapper) for batch in batches]


def _pair(**options):
    torch.manual_seed(0)
    reference = _Regressor()
    model = copy.deepcopy(reference)
    return (reference, OptimWrapper(torch.optim.SGD(reference.parameters(), lr=0.5)),
            model, MicroBatchOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
                                          **options))


@pytest.mark.parametrize('micro_batches', [2, 5])  # 12 samples: 6+6, and uneven 3+3+2+2+2
def test_micro_batches_give_the_full_batch_update_and_loss(micro_batches):
    reference, reference_wrapper, model, wrapper = _pair(micro_batches=micro_batches)
    batches = [_batch(seed=seed) for seed in range(3)]
    expected = _train(reference, reference_wrapper, batches)
    logs = _train(model, wrapper, batches)
    for param, ref in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(param, ref, rtol=1e-5, atol=1e-6)
    for log, ref in zip(logs, expected):
        torch.testing.assert_close(log['loss'], ref['loss'], rtol=1e-5, atol=1e-6)
    assert wrapper.inner_count == 3  # one iteration per loaded batch


def test_micro_batching_composes_with_accumulation_across_batches():
    torch.manual_seed(0)
    reference = _Regressor()
    model = copy.deepcopy(reference)
    ref_wrapper = OptimWrapper(torch.optim.SGD(reference.parameters(), lr=0.5),
                               accumulative_counts=2)
    wrapper = MicroBatchOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
                                     accumulative_counts=2, micro_batches=3)
    batches = [_batch(seed=seed) for seed in range(4)]
    _train(reference, ref_wrapper, batches)
    _train(model, wrapper, batches)
    for param, ref in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(param, ref, rtol=1e-5, atol=1e-6)


def test_state_dict_keeps_gradients_of_an_unfinished_accumulation_window():
    torch.manual_seed(0)
    model = _Regressor()
    wrapper = MicroBatchOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
                                     accumulative_counts=2, micro_batches=2)
    _train(model, wrapper, [_batch(seed=0)], max_iters=4)
    state = copy.deepcopy(wrapper.state_dict())
    assert 'accumulated_gradients' in state
    expected = [param.grad.clone() for param in model.parameters()]
    fresh = _Regressor()
    fresh.load_state_dict(model.state_dict())
    fresh_wrapper = MicroBatchOptimWrapper(
        optimizer=torch.optim.SGD(fresh.parameters(), lr=0.5), accumulative_counts=2)
    fresh_wrapper.load_state_dict(copy.deepcopy(state))
    for param, grad in zip(fresh.parameters(), expected):
        torch.testing.assert_close(param.grad, grad)

    other = nn.Linear(16, 1)  # parameters that do not fit: the window starts afresh
    other_wrapper = MicroBatchOptimWrapper(optimizer=torch.optim.SGD(other.parameters(), lr=0.5))
    state['param_groups'][0]['params'] = [0, 1]
    state['state'] = {}
    other_wrapper.load_state_dict(state)
    assert all(param.grad is None for param in other.parameters())


def test_memory_budget_picks_a_split_that_fits_and_leaves_training_unchanged():
    reference, reference_wrapper, model, wrapper = _pair(memory_budget=0.6)
    batches = [_batch(size=64, seed=seed) for seed in range(2)]
    _train(reference, reference_wrapper, batches)
    _train(model, wrapper, batches)
    decision = wrapper.split_decision
    assert decision.micro_batches > 1 and decision.peak_bytes <= decision.budget_bytes
    assert decision.budget_bytes == int(0.6 * decision.measured[64])
    for param, ref in zip(model.parameters(), reference.parameters()):  # trials left no trace
        torch.testing.assert_close(param, ref, rtol=1e-5, atol=1e-6)


def test_a_budget_below_one_sample_states_the_smallest_reachable_peak():
    _, _, model, wrapper = _pair(memory_budget=1000)
    with pytest.raises(ConfigError, match=r'below the peak of a single sample.*: \d+ bytes'):
        _train(model, wrapper, [_batch()])
    assert all(param.grad is None for param in model.parameters())


def test_a_memory_budget_splits_a_batch_norm_model_into_parts_of_two_or_more():
    """BatchNorm1d cannot train on one sample: the search starts from two (before, its trial of
    one sample ended the run with BatchNorm's ValueError)."""
    torch.manual_seed(0)
    model = _Regressor(norm=nn.BatchNorm1d)
    wrapper = MicroBatchOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
                                     memory_budget=0.6)
    _train(model, wrapper, [_batch(size=64)])
    decision = wrapper.split_decision
    assert 1 < decision.micro_batches <= 32 and decision.peak_bytes <= decision.budget_bytes
    assert 1 not in decision.measured


class _PaddingDetector(BaseModel):
    """Pads its list of images to the largest height and width, as mmdet's preprocessor does."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)

    def forward(self, inputs, targets=None, mode='loss'):
        height = max(image.shape[-2] for image in inputs)
        width = max(image.shape[-1] for image in inputs)
        batch = torch.stack([nn.functional.pad(image, (0, width - image.shape[-1],
                                                       0, height - image.shape[-2]))
                             for image in inputs])
        return dict(loss=self.conv(batch).square().mean())


def test_trial_parts_hold_the_largest_images_so_every_real_part_fits():
    """The split is measured on the batch's tallest and widest images first: the part a
    trial measures is the heaviest of its size, whatever order the batch came in (before, a
    trial of the first samples measured the small images and a later part ran over)."""
    sizes = [(32, 32)] * 6 + [(96, 40), (40, 96)]
    data = dict(inputs=[torch.randn(3, *size) for size in sizes], targets=torch.zeros(8))
    model = _PaddingDetector()
    wrapper = MicroBatchOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                     memory_budget=0.35)
    _train(model, wrapper, [data])
    decision = wrapper.split_decision
    assert decision.micro_batches > 1
    parts = split_batch(data, micro_batch_sizes(8, decision.micro_batches))
    for part in parts:  # each real part, as training runs it, within the budget
        peak = trial_peak(lambda: model.train_step.run_part(part, len(part['inputs'])), model,
                          wrapper.optimizer)
        assert peak <= decision.budget_bytes, (peak, decision)


def test_more_micro_batches_than_samples_is_an_error():
    _, _, model, wrapper = _pair(micro_batches=13)
    with pytest.raises(ConfigError, match='12 samples into 13 micro-batches'):
        _train(model, wrapper, [_batch()])


@pytest.mark.parametrize('options, message', [
    (dict(micro_batches=0), 'positive integer'),
    (dict(micro_batches=2, memory_budget='1GB'), 'not both'),
    (dict(memory_budget='half'), "memory_budget is a fraction .* got 'half'"),
    (dict(memory_budget=1.5), r'must lie in \(0, 1\]'),
])
def test_bad_options_are_clear_errors(options, message):
    with pytest.raises(ConfigError, match=message):
        MicroBatchOptimWrapper(optimizer=torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1),
                               **options)


def test_batch_norm_models_get_a_warning_naming_the_layers():
    with _logged() as records:
        model = _Regressor(norm=nn.BatchNorm1d)
        wrapper = MicroBatchOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                         micro_batches=2)
        _train(model, wrapper, [_batch()])
    warnings = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert any('body.1' in text and 'SyncBN' in text for text in warnings), warnings


def test_bf16_mixed_precision_on_cpu_with_micro_batches_trains():
    torch.manual_seed(0)
    model = _Regressor()
    with _logged() as records:
        wrapper = MixedPrecisionOptimWrapper(
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1), micro_batches=2)
    assert wrapper.cast_dtype is torch.bfloat16 and not wrapper.loss_scaler.is_enabled()
    assert [r.getMessage() for r in records] == [
        'mixed precision: bfloat16 autocast on cpu, no loss scaling']
    outputs = []
    model.body.register_forward_hook(lambda module, args, out: outputs.append(out.dtype))
    before = [param.clone() for param in model.parameters()]
    _train(model, wrapper, [_batch()])
    assert outputs == [torch.bfloat16, torch.bfloat16]
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_fp16_mixed_precision_scales_the_loss_and_logs_the_scale():
    from mmengine.logging import MessageHub

    torch.manual_seed(0)
    model = _Regressor()
    wrapper = MixedPrecisionOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                         dtype='float16', loss_scale=1024.0)
    assert wrapper.loss_scaler.is_enabled()
    _train(model, wrapper, [_batch()])
    logged = MessageHub.get_current_instance().get_scalar('train/loss_scale').current()
    assert logged == wrapper.loss_scaler.get_scale() == 1024.0


def test_mixed_precision_rejects_an_unknown_dtype():
    with pytest.raises(ConfigError, match="'float16' or 'bfloat16'"):
        MixedPrecisionOptimWrapper(optimizer=torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=1),
                                   dtype='int8')
