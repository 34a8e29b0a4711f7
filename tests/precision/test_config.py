"""Mixed precision and micro-batches as configurations: every bad value one line, made again from
their JSON, and the memory budget's bf16 setting saved as its configuration."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from mmdropit.errors import ConfigError
from mmdropit.microbatch import MicroBatchConfig
from mmdropit.planner import bf16_switch
from mmdropit.planner.techniques import MeasuredSettings
from mmdropit.precision import MixedPrecisionConfig


@pytest.mark.parametrize('options,message', [
    (dict(dtype='half'), "dtype must be 'float16' or 'bfloat16', got 'half'"),
    (dict(dtype=torch.float32), "dtype must be 'float16' or 'bfloat16'"),
    (dict(loss_scale='auto'), "loss_scale must be 'dynamic', a number"),
    (dict(loss_scale=True), "loss_scale must be 'dynamic', a number"),
])
def test_a_bad_mixed_precision_value_is_one_line_naming_who_gave_it(options, message):
    with pytest.raises(ConfigError, match=message) as raised:
        MixedPrecisionConfig(**options, where='MixedPrecisionOptimWrapper')
    assert str(raised.value).startswith('MixedPrecisionOptimWrapper ')
    assert '\n' not in str(raised.value)


@pytest.mark.parametrize('options', [dict(), dict(dtype=torch.bfloat16),
                                     dict(dtype='float16', loss_scale=512),
                                     dict(dtype='float16', loss_scale={'growth_interval': 10})])
def test_a_mixed_precision_configuration_is_made_again_from_its_json(options):
    config = MixedPrecisionConfig(**options)
    assert MixedPrecisionConfig(**config.to_json()) == config
    assert hash(config) == hash(MixedPrecisionConfig(**config.to_json()))


def test_the_loss_scaler_scales_float16_only_and_keeps_its_arguments():
    assert not MixedPrecisionConfig('bfloat16').loss_scaler('cpu').is_enabled()
    scaler = MixedPrecisionConfig('float16', loss_scale={'init_scale': 64.0}).loss_scaler('cpu')
    assert scaler.is_enabled() and scaler.get_scale() == 64.0
    assert MixedPrecisionConfig('float16', loss_scale=8.0).fixed_scale == 8.0
    assert MixedPrecisionConfig('float16', loss_scale=8).fixed_scale is None


def test_the_autocast_context_runs_the_forward_pass_in_the_dtype():
    net = nn.Linear(4, 4)
    with MixedPrecisionConfig('bfloat16').autocast('cpu'):
        out = net(torch.randn(2, 4))
    assert out.dtype == torch.bfloat16


@pytest.mark.parametrize('options,message', [
    (dict(micro_batches=0), 'micro_batches must be a positive integer, got 0'),
    (dict(micro_batches=2.0), 'micro_batches must be a positive integer, got 2.0'),
    (dict(micro_batches=True), 'micro_batches must be a positive integer, got True'),
    (dict(micro_batches=2, memory_budget=0.5), 'not both'),
    (dict(memory_budget='half'), 'a micro-batch memory_budget is a fraction'),
])
def test_a_bad_micro_batch_value_is_one_line(options, message):
    with pytest.raises(ConfigError, match=message):
        MicroBatchConfig(**options)


def test_a_micro_batch_configuration_is_made_again_from_its_json():
    for config in (MicroBatchConfig(4), MicroBatchConfig(memory_budget='512MiB'),
                   MicroBatchConfig()):
        assert MicroBatchConfig(**config.to_json()) == config
    assert MicroBatchConfig(memory_budget='512MiB').memory_budget == 2**29


class _Holder:
    switched_precision = None


def test_the_bf16_setting_is_saved_as_its_configuration_and_a_saved_position_still_reads():
    holder = _Holder()
    switch = bf16_switch(holder)
    technique = MeasuredSettings(switch.name, switch.settings, lambda setting: None,
                                 switch.text, switch.apply, switch.remove)
    setting = switch.settings[0]
    saved = technique.encode(setting)
    assert saved == {'dtype': 'bfloat16', 'loss_scale': 'dynamic'}
    assert technique.decode(saved) == setting
    assert technique.decode(0) == setting  # how decisions before configurations saved it
    technique.apply(setting, None)
    assert holder.switched_precision.dtype_on('cpu') is torch.bfloat16
    technique.remove(None)
    assert holder.switched_precision is None
