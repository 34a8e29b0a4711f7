"""CheckpointPlanHook in real MMEngine runs: planning, logging, the plan file, shape buckets,
DropIT together, bad budgets, and a model that cannot be planned."""
from __future__ import annotations

import json
import re

import pytest
from mmengine.runner import Runner

import mmdropit  # noqa: F401
from mmdropit import ConfigError
from mmdropit.checkpoint import CheckpointPlan, is_checkpointed
from mmdropit.engine.hooks import CheckpointPlanHook
from tests.conftest import (FLEXIBLE_RUNNER, ROOT, TINY_VIT, TINY_VIT_2_ITERS, TINY_VIT_DROPIT,
                            assert_ranks_identical, log_text, one_line_error, run_tool,
                            train_on_two_ranks, two_iteration_cfg)


def test_hook_plans_logs_writes_and_applies_with_dropit(tmp_path):
    cfg = two_iteration_cfg(TINY_VIT_DROPIT, tmp_path,
                             dict(type='CheckpointPlanHook', budget=None, granularity=8))
    runner = Runner.from_cfg(cfg)
    runner.train()
    model = runner.model
    checkpointed = [name for name, m in model.named_modules() if is_checkpointed(m)]
    assert checkpointed and all(name.startswith('model.blocks') for name in checkpointed)
    log = log_text(tmp_path)
    assert 'Checkpoint plan (' in log and 'predicted activation peak' in log
    # the 28x28 digits' plan is named after their shape bucket, 32x1x128x128
    assert 'for inputs 32x1x28x28 (shape bucket 32x1x128x128); written to ' in log
    summary, = re.findall(r'mmdropit: CheckpointPlanHook: .*', log)
    assert re.fullmatch(
        r'mmdropit: CheckpointPlanHook: inputs 32x1x28x28 \(shape bucket 32x1x128x128\): '
        r'checkpoint plan of \d+ checkpoints for the least memory: predicted activation peak '
        r'[0-9.]+ MiB, 0\.\d\d of the unplanned [0-9.]+ MiB; written to '
        r'\S+/checkpoint_plan_32x1x128x128\.json', summary), summary
    plan = json.loads((tmp_path / 'checkpoint_plan_32x1x128x128.json').read_text())
    assert plan['targets'] and plan['planned']['activation_peak'] < \
        plan['baseline']['activation_peak']
    hook = next(h for h in runner.hooks if isinstance(h, CheckpointPlanHook))
    assert list(hook.plans) == [(32, 1, 128, 128)]  # planned once, reused on iteration 2

    # a new input-shape bucket gets its own plan; an old one reuses its plan
    batch = next(iter(runner.train_dataloader))
    half = {key: value[:16] for key, value in batch.items()}
    hook.before_train_iter(runner, 0, half)
    assert list(hook.plans) == [(32, 1, 128, 128), (16, 1, 128, 128)]
    assert hook.current == (16, 1, 128, 128)
    hook.before_train_iter(runner, 1, batch)
    assert len(hook.plans) == 2 and hook.current == (32, 1, 128, 128)
    assert (tmp_path / 'checkpoint_plan_16x1x128x128.json').is_file()


def test_a_model_that_cannot_be_planned_warns_and_trains(tmp_path, monkeypatch):
    import mmdropit.engine.hooks.checkpoint_plan_hook as module

    def broken(*args, **kwargs):
        raise RuntimeError('cannot record this forward')

    monkeypatch.setattr(module, 'plan_checkpoints', broken)
    cfg = two_iteration_cfg(TINY_VIT, tmp_path, dict(type='CheckpointPlanHook'))
    runner = Runner.from_cfg(cfg)
    runner.train()
    assert runner.iter == 2
    log = log_text(tmp_path)
    assert 'cannot be planned for inputs 32x1x28x28 (shape bucket 32x1x128x128): RuntimeError: ' \
           'cannot record this forward; training continues without a checkpoint plan' in log
    assert re.findall(r'mmdropit: CheckpointPlanHook: .*', log) == [
        'mmdropit: CheckpointPlanHook: inputs 32x1x28x28 (shape bucket 32x1x128x128): trains '
        'without a checkpoint plan (the warning above says why)']
    assert not any(is_checkpointed(m) for m in runner.model.modules())


def test_a_step_that_runs_out_of_memory_while_recorded_is_one_line_through_train_py(tmp_path):
    """``DeviceCapacityHook``: the network runs out of memory on more than 12 of the 32
    samples, as the recorded step does on a device too small for it."""
    config = tmp_path / 'config.py'
    config.write_text(f"_base_ = r'{TINY_VIT}'\n"
                      "custom_imports = dict(imports=['mmdropit', "
                      "'tests.helpers.device_capacity_hook'], allow_failed_imports=False)\n"
                      "custom_hooks = [dict(type='DeviceCapacityHook', samples=12), "
                      "dict(type='CheckpointPlanHook')]\n"
                      "train_cfg = dict(max_epochs=1)\n"
                      "train_dataloader = dict(dataset=dict(indices=64))\n")
    result = run_tool('tools/train.py', str(config), '--work-dir', str(tmp_path), check=False)
    assert 'the step ran out of memory while it was recorded for inputs 32x1x28x28' in \
        one_line_error(result)


@pytest.mark.parametrize('kwargs,message', [
    (dict(budget='half'), 'checkpoint budget is None'),
    (dict(budget=2.0), r'a fraction must lie in \(0, 1\]'),
    (dict(granularity=0), 'granularity must be an int'),
    (dict(inputs_on_host='yes'), 'inputs_on_host is True or False'),
])
def test_bad_hook_arguments_are_clear_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        CheckpointPlanHook(**kwargs)


def test_inputs_on_host_on_a_cpu_model_warns_and_plans_them_on_the_device(tmp_path):
    cfg = two_iteration_cfg(TINY_VIT, tmp_path,
                            dict(type='CheckpointPlanHook', budget=0.5, inputs_on_host=True))
    Runner.from_cfg(cfg).train()
    log = log_text(tmp_path)
    assert ('CheckpointPlanHook: inputs_on_host=True keeps the inputs where they are on a model '
            'that is not on a GPU; the plan is searched with them there.') in log
    plan = CheckpointPlan.load(tmp_path / 'checkpoint_plan_32x1x128x128.json')
    assert plan.targets and not plan.inputs_on_host


def test_impossible_budget_is_one_line_through_train_py(tmp_path):
    config = tmp_path / 'config.py'
    config.write_text(f"_base_ = r'{TINY_VIT}'\n"
                      "custom_hooks = [dict(type='CheckpointPlanHook', budget='1KB')]\n"
                      "train_cfg = dict(max_epochs=1)\n"
                      "train_dataloader = dict(dataset=dict(indices=64))\n")
    result = run_tool('tools/train.py', str(config), '--work-dir', str(tmp_path), check=False)
    assert result.returncode != 0 and 'Traceback' not in result.stderr, result.stderr[-2000:]
    assert 'below what any plan reaches: the least activation peak is about' in result.stderr


@pytest.mark.parametrize('runner', ['', FLEXIBLE_RUNNER], ids=['Runner', 'FlexibleRunner'])
def test_ddp_two_gloo_processes_share_one_plan_and_stay_in_sync(tmp_path, runner):
    log = train_on_two_ranks(tmp_path, "dict(type='DropITHook', gamma=0.9), "
                             "dict(type='CheckpointPlanHook', budget=0.6)", runner)
    assert 'Distributed training: True' in log and 'Checkpoint plan (' in log
    # the output of both ranks: rank 0 alone logs each hook's summary line
    for hook in ('DropITHook', 'CheckpointPlanHook'):
        assert len(re.findall(rf'mmdropit: {hook}: ', log)) == 1, hook
    assert 'mmdropit: CheckpointPlanHook: inputs 16x1x28x28 (shape bucket 16x1x128x128): ' \
        'checkpoint plan of ' in log
    assert_ranks_identical(tmp_path)
    assert len(list(tmp_path.glob('checkpoint_plan_*.json'))) == 1


def test_mmengine_compile_trains_with_a_plan_and_dropit(tmp_path):
    """``compile=True`` (inductor): the plan made on the first iteration is applied to the
    compiled model (dynamo re-traces it with the checkpoints as its checkpoint regions), and the
    losses are those of the eager run (the plan is exact). The compiled run's least-memory plan
    is single-level, the eager run's nests."""
    config = ROOT / 'configs' / 'tiny' / 'vit-tiny_dropit-mink0.9_ckpt-plan_mnist5k.py'
    losses, nests = [], []
    for compiled in (False, True):
        result = run_tool('tools/train.py', str(config), '--work-dir',
                          str(tmp_path / str(compiled)), '--cfg-options', *TINY_VIT_2_ITERS,
                          f'compile={compiled}')
        log = result.stdout + result.stderr
        assert 'Checkpoint plan (' in log
        losses.append(re.findall(r'Epoch\(train\).*?\bloss: ([0-9.]+)', log))
        plan_file, = (tmp_path / str(compiled)).glob('checkpoint_plan_*.json')
        nests.append(any(target.inner for target in CheckpointPlan.load(plan_file).targets))
    assert len(losses[1]) == 2 and losses[1] == losses[0]
    assert nests == [True, False]
