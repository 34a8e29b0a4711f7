"""FSDP1 / FSDP2 training on two gloo CPU processes: DDP parity, DropIT, frozen parameters,
gradient accumulation, full-state checkpoints (plain load and resume), launch errors."""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from mmengine.config import Config
from mmengine.model import BaseModel
from mmengine.optim import OptimWrapper
from mmengine.registry import MODELS

from mmdropit.common.process_exit import end_distributed_process
from mmdropit.engine.fsdp import (DistributedLaunchError, FullyShardModelWrapper,
                                  FullyShardStrategy, ShardPolicy, check_launch)
from mmdropit.engine.classification import TimmClassifier
from mmdropit.engine.optim import MicroBatchOptimWrapper
from mmdropit.memory.trial_peak import trial_peak
from tests.conftest import (FLEXIBLE_RUNNER, TINY_VIT_2_ITERS, TINY_VIT_DROPIT, free_port,
                            run_dist_train, run_tool)


@MODELS.register_module(force=True)
class FrozenPatchEmbedClassifier(TimmClassifier):
    """The tiny ViT with its patch embedding frozen at construction (like mmdet
    ``frozen_stages``)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.model.patch_embed.requires_grad_(False)


BASE = (f"_base_ = r'{TINY_VIT_DROPIT}'\n"
        "custom_imports = dict(imports=['mmdropit', 'tests.helpers.rank_state_hook', "
        "'tests.engine.test_fsdp'], allow_failed_imports=False)\n"
        "model = dict(type='FrozenPatchEmbedClassifier')\n"
        "optim_wrapper = dict(accumulative_counts=2)\n")
DROPIT = "dict(type='DropITHook', gamma=0.9)"
PLAN = "dict(type='CheckpointPlanHook')"
FULLY_SHARD = "model_wrapper_cfg = dict(type='FullyShardModelWrapper', dropit=dict(gamma=0.9))\n"
STRATEGY = ("runner_type = 'FlexibleRunner'\nstrategy = dict(type='FullyShardStrategy', "
            "model_wrapper=dict(dropit=dict(gamma=0.9)))\n")
OFFLOADED = STRATEGY.replace('dropit=dict(gamma=0.9)', 'dropit=dict(gamma=0.9), cpu_offload=True')


def train(work_dir: Path, extra: str, hooks: list[str], epochs: int = 1, *args: str) -> str:
    """Two iterations per epoch (batch 16 per rank) of the frozen tiny ViT on two processes."""
    work_dir.mkdir(parents=True, exist_ok=True)
    config = work_dir / 'config.py'
    config.write_text(BASE + extra + f"custom_hooks = [{', '.join(hooks)}]\n")
    options = [o for o in TINY_VIT_2_ITERS if not o.startswith('train_cfg.max_epochs')]
    result = run_dist_train(str(config), 2, '--work-dir', str(work_dir), *args, '--cfg-options',
                            *options, f'train_cfg.max_epochs={epochs}',
                            'train_dataloader.batch_size=16')
    return result.stdout + result.stderr


def losses(log: str) -> list[float]:
    return [float(v) for v in re.findall(r'Epoch\(train\).*?\bloss: ([0-9.]+)', log)]


def grad_norms(log: str) -> list[float]:
    return [float(v) for v in re.findall(r'Epoch\(train\).*?\bgrad_norm: ([0-9.]+)', log)]


@pytest.fixture(scope='module')
def runs(tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """DDP for two epochs; FSDP2 (Runner wrapper and FlexibleRunner strategy, the latter with a
    checkpoint plan, which recomputes without changing the losses, and with the model state
    offloaded to host memory, which moves nothing here but runs FSDP2's offload path) for
    one."""
    root = tmp_path_factory.mktemp('fsdp')
    save, hook = "dict(type='SaveRankStateHook')", "dict(type='FullyShardCheckpointHook')"
    return {
        'ddp': (root / 'ddp', train(root / 'ddp', '', [DROPIT, save], 2)),
        'wrapper': (root / 'wrapper', train(root / 'wrapper', FULLY_SHARD, [DROPIT, save, hook])),
        'strategy': (root / 'strategy', train(root / 'strategy', STRATEGY, [DROPIT, PLAN])),
        'cpu-offload': (root / 'offload', train(root / 'offload', OFFLOADED, [DROPIT])),
    }


@pytest.mark.parametrize('kind', ['wrapper', 'strategy', 'cpu-offload'])
def test_fully_shard_matches_ddp_with_dropit_frozen_and_accumulation(runs, kind):
    _, ddp_log = runs['ddp']
    work_dir, log = runs[kind]
    assert 'Distributed training: True' in log and 'DropIT on 16 layers' in log
    assert ('Checkpoint plan (' in log) == (kind == 'strategy')
    assert len(losses(log)) == 2
    assert losses(log) == pytest.approx(losses(ddp_log)[:2], abs=1e-3)
    checkpoint = torch.load(work_dir / 'epoch_1.pth', weights_only=False)
    assert all(type(v) is torch.Tensor for v in checkpoint['state_dict'].values())
    assert checkpoint['state_dict']['model.blocks.0.attn.qkv.weight'].shape == (288, 96)


def test_frozen_parameters_stay_and_ranks_agree(runs):
    work_dir, _ = runs['wrapper']
    initial, final, other = (torch.load(work_dir / name) for name in
                             ('rank0_initial.pt', 'rank0_final.pt', 'rank1_final.pt'))
    assert all(torch.equal(value, other[key]) for key, value in final.items())
    for key, value in final.items():
        frozen = 'patch_embed' in key
        assert torch.equal(value, initial[key]) == frozen, key


def test_fsdp2_checkpoint_loads_into_a_plain_model_and_resumes(runs, tmp_path):
    work_dir, _ = runs['wrapper']
    checkpoint = torch.load(work_dir / 'epoch_1.pth', weights_only=False)
    plain = MODELS.build(Config.fromfile(TINY_VIT_DROPIT).model)
    plain.load_state_dict(checkpoint['state_dict'], strict=True)
    optimizer = torch.optim.AdamW(plain.parameters())
    optimizer.load_state_dict({k: checkpoint['optimizer'][k] for k in ('state', 'param_groups')})

    log = train(tmp_path, FULLY_SHARD, [DROPIT, "dict(type='FullyShardCheckpointHook')"], 2,
                '--resume', str(work_dir / 'epoch_1.pth'))
    assert 'resumed epoch: 1, iter: 2' in log
    assert losses(log) == pytest.approx(losses(runs['ddp'][1])[2:], abs=1e-3)


def test_fully_shard_with_micro_batches_in_bf16_and_a_plan(tmp_path):
    amp = ("optim_wrapper = dict(type='MixedPrecisionOptimWrapper', use_fsdp=True, "
           "micro_batches=2)\n")
    log = train(tmp_path, FULLY_SHARD + amp,
                [DROPIT, PLAN, "dict(type='FullyShardCheckpointHook')"])
    assert 'runs as 2 micro-batch(es) of sizes [8, 8]' in log and 'Checkpoint plan (' in log
    assert len(losses(log)) == 2


def test_memory_budget_under_fully_shard_bounds_each_rank(tmp_path):
    """MemoryBudgetHook under FSDP2: the budget is per rank, and a rank's fixed bytes are its
    shards of the parameters, gradients and optimizer state (about half of DDP's on two)."""
    hook = "dict(type='MemoryBudgetHook', budget=0.85)"
    decisions = {}
    save = "dict(type='FullyShardCheckpointHook')"
    for kind, extra, hooks in (('ddp', '', [hook]), ('fsdp2', FULLY_SHARD, [hook, save])):
        log = train(tmp_path / kind, extra, hooks)
        assert 'MemoryBudgetHook for inputs 16x' in log, log[-2000:]
        assert len(losses(log)) == 2
        decisions[kind], = json.loads((tmp_path / kind / 'memory_plan.json').read_text()).values()
    for decision in decisions.values():
        assert decision['measured_peak_bytes'] <= decision['budget_bytes']
    assert 0.4 < decisions['fsdp2']['fixed_bytes'] / decisions['ddp']['fixed_bytes'] < 0.6

    # below what every pass holds (the gathered parameters): one line, naming more processes
    low = tmp_path / 'low'
    low.mkdir()
    (low / 'config.py').write_text(
        BASE + FULLY_SHARD + "custom_hooks = [dict(type='MemoryBudgetHook', budget=0.3), "
        "dict(type='FullyShardCheckpointHook')]\n")
    result = run_dist_train(str(low / 'config.py'), 2, '--work-dir', str(low), '--cfg-options',
                            *TINY_VIT_2_ITERS, 'train_dataloader.batch_size=16', check=False)
    assert result.returncode != 0
    assert 'is below what these techniques reach' in result.stdout + result.stderr
    assert 'sharding over more than 2 processes' in result.stdout + result.stderr


def test_memory_budget_under_the_fully_shard_strategy(tmp_path):
    """FlexibleRunner with FullyShardStrategy: the hook plans the strategy's sharded model and
    optim wrapper, and the decision fits each rank."""
    log = train(tmp_path, STRATEGY, ["dict(type='MemoryBudgetHook', budget=0.85)"])
    assert 'MemoryBudgetHook for inputs 16x' in log, log[-2000:]
    assert len(losses(log)) == 2
    decision, = json.loads((tmp_path / 'memory_plan.json').read_text()).values()
    assert decision['chosen'] != 'nothing'
    assert decision['measured_peak_bytes'] <= decision['budget_bytes']


def test_fsdp1_wrapper_trains_under_runner(tmp_path, runs):
    log = train(tmp_path, "model_wrapper_cfg = dict(type='FSDPModelWrapper')\n",
                [DROPIT, "dict(type='FullyShardCheckpointHook')"])
    assert len(losses(log)) == 2
    # clip_grad uses the norm over both ranks' shards: the first step's norm is DDP's
    assert grad_norms(log)[0] == pytest.approx(grad_norms(runs['ddp'][1])[0], rel=1e-3)
    checkpoint = torch.load(tmp_path / 'epoch_1.pth', weights_only=False)
    assert checkpoint['state_dict']['model.blocks.0.attn.qkv.weight'].shape == (288, 96)


def test_sharding_without_a_process_group_says_how_to_launch(tmp_path):
    assert not dist.is_initialized()
    with pytest.raises(DistributedLaunchError, match='bash tools/dist_train.sh CONFIG 2'):
        FullyShardModelWrapper(torch.nn.Linear(2, 2))
    cfg = Config(dict(model_wrapper_cfg=dict(type='FullyShardModelWrapper'), launcher='none'))
    with pytest.raises(DistributedLaunchError, match='torchrun'):
        check_launch(cfg)
    config = tmp_path / 'config.py'
    config.write_text(f"_base_ = r'{TINY_VIT_DROPIT}'\n" + FLEXIBLE_RUNNER.replace(
        'DDPStrategy', 'FullyShardStrategy'))
    result = run_tool('tools/train.py', str(config), '--work-dir', str(tmp_path), check=False)
    assert result.returncode != 0 and 'Traceback' not in result.stderr
    assert 'error: FullyShardStrategy shards the model across processes' in result.stderr
    assert 'bash tools/dist_train.sh CONFIG 2' in result.stderr


class _TwoLayers(BaseModel):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))

    def forward(self, inputs, data_samples=None, mode='loss'):
        return {'loss': self.layers(inputs).square().mean()}


def _accumulate(rank: int, port: int, out: str) -> None:
    dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank,
                            world_size=2)
    model = FullyShardModelWrapper(_TwoLayers())
    model.collective_saves = True
    optim = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), accumulative_counts=2)
    optim.initialize_count_status(model, 0, 2)
    weight = model.module.layers[0].weight
    initial = weight.full_tensor()
    model.train_step(dict(inputs=torch.randn(3, 4)), optim)
    reduced = weight.grad is not None  # a reduce-scatter would have set the sharded gradient
    model.train_step(dict(inputs=torch.randn(3, 4)), optim)
    torch.save((reduced, initial, weight.full_tensor()), f'{out}{rank}')
    end_distributed_process()


def test_accumulation_skips_the_reduce_scatter_until_the_update(tmp_path):
    torch.multiprocessing.spawn(_accumulate, args=(free_port(), str(tmp_path / 'rank')), nprocs=2)
    (reduced, initial, final), (_, _, other) = (torch.load(tmp_path / f'rank{r}') for r in (0, 1))
    assert not reduced  # the first iteration kept its gradient local (no_sync)
    assert torch.equal(final, other) and not torch.equal(final, initial)  # then one update


def _offload_policies(rank: int, port: int, out: str) -> None:
    dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank,
                            world_size=2)
    policies = [type(FullyShardModelWrapper(_TwoLayers(), cpu_offload=offload).module
                     ._get_fsdp_state()._fsdp_param_group.offload_policy).__name__
                for offload in (True, False)]
    torch.save(policies, f'{out}{rank}')
    end_distributed_process()


def test_cpu_offload_puts_fsdp2s_offload_policy_on_the_units(tmp_path):
    torch.multiprocessing.spawn(_offload_policies, args=(free_port(), str(tmp_path / 'rank')),
                                nprocs=2)
    assert torch.load(tmp_path / 'rank0') == ['CPUOffloadPolicy', 'OffloadPolicy']


def test_shard_policy_selects_blocks_and_resnet_stages():
    import timm
    from mmdet.models.backbones import ResNet

    vit = timm.create_model('vit_tiny_patch16_224', img_size=28, patch_size=7, depth=2)
    assert [name for name, _ in ShardPolicy().units(vit)] == ['blocks.1', 'blocks.0']
    detector = torch.nn.Module()
    detector.backbone = ResNet(depth=18, frozen_stages=1)
    names = [name for name, _ in ShardPolicy().units(detector)]
    assert names == [f'backbone.layer{i}' for i in (4, 3, 2, 1)]
    custom = ShardPolicy(classes=['Attention'], names=['head'])
    assert [n for n, _ in custom.units(vit)] == ['head', 'blocks.1.attn', 'blocks.0.attn']


def _trial_then_step(rank: int, port: int, out: str) -> None:
    """A trial pass (gradient sync off, as a micro-batch that is not the last) under FSDP2,
    then a real step: its gradients against the same step without the trial."""
    dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank,
                            world_size=2)
    torch.manual_seed(0)
    reference = _TwoLayers()
    inputs = [torch.randn(6, 4) + rank for _ in range(2)]
    gradients = []
    for trial in (False, True):
        model = FullyShardModelWrapper(copy.deepcopy(reference))
        model.collective_saves = True
        optim = MicroBatchOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
                                       micro_batches=2)
        optim.initialize_count_status(model, 0, 2)
        if trial:
            trial_peak(lambda: model.train_step.run_part(dict(inputs=inputs[1]), 3), model.module,
                       optim.optimizer)
        optim.optimizer.step = lambda *args, **kwargs: None
        optim.zero_grad = lambda *args, **kwargs: None
        model.train_step(dict(inputs=inputs[0]), optim)
        gradients.append([param.grad.full_tensor() for param in model.parameters()])
    torch.save(gradients, f'{out}{rank}')
    end_distributed_process()


def test_a_trial_pass_leaves_nothing_in_fsdp2s_unsharded_gradients(tmp_path):
    torch.multiprocessing.spawn(_trial_then_step, args=(free_port(), str(tmp_path / 'rank')),
                                nprocs=2)
    without, after_trial = torch.load(tmp_path / 'rank0')
    for plain, trialled in zip(without, after_trial):
        assert torch.equal(plain, trialled)


def _window_across_processes(rank: int, port: int, out: str) -> None:
    dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank,
                            world_size=2)
    plain = _TwoLayers()
    optim = MicroBatchOptimWrapper(optimizer=torch.optim.SGD(plain.parameters(), lr=0.1),
                                   accumulative_counts=2)
    optim.initialize_count_status(plain, 0, 4)
    optim.update_params(plain(torch.randn(3, 4))['loss'])  # the window's first iteration
    saved = optim.state_dict()
    single = dict(saved, accumulated_gradients=[p.grad.clone() for p in plain.parameters()])
    model = FullyShardModelWrapper(_TwoLayers())  # a single-process checkpoint, resumed here
    model.collective_saves = True
    resumed = MicroBatchOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                     accumulative_counts=2)
    resumed.load_state_dict(single)
    resumed.initialize_count_status(model, 1, 4)
    model.train_step(dict(inputs=torch.randn(3, 4)), resumed)  # ends the window: one update
    torch.save(('accumulated_gradients' in saved,
                [p.grad for p in model.parameters()]), f'{out}{rank}')
    end_distributed_process()


def test_an_accumulation_window_of_several_processes_resumes_afresh(tmp_path):
    """Each process holds its own gradients until the window ends, one writes the checkpoint:
    they are not saved; a single-process checkpoint's are not put into FSDP2's shards (which
    failed in FSDP2's reduce-scatter: a plain tensor where a DTensor was expected)."""
    torch.multiprocessing.spawn(_window_across_processes,
                                args=(free_port(), str(tmp_path / 'rank')), nprocs=2)
    saved, gradients = torch.load(tmp_path / 'rank0', weights_only=False)
    assert not saved and all(grad is None for grad in gradients)  # stepped and zeroed


class _Classifier(BaseModel):
    def __init__(self, classes: int) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, classes))

    def forward(self, inputs, data_samples=None, mode='loss'):
        return {'loss': self.layers(inputs).square().mean()}


def _load_another_head(rank: int, port: int, out: str) -> None:
    dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank,
                            world_size=2)
    torch.manual_seed(0)  # the same checkpoint on both ranks
    pretrained = _Classifier(classes=5).state_dict()
    strategy = FullyShardStrategy()
    strategy.model = FullyShardModelWrapper(_Classifier(classes=1), full_state_dict_hooks=False)
    strategy.load_model_state_dict(dict(pretrained))
    body = strategy.model.module.layers[0].weight.full_tensor()
    torch.save(torch.equal(body, pretrained['layers.0.weight']), f'{out}{rank}')
    end_distributed_process()


def test_load_from_a_checkpoint_with_another_head_loads_the_rest(tmp_path):
    """Fine-tuning from weights of other classes: MMEngine's loader warns of the head's other
    shape and loads the rest; under FullyShardStrategy torch's loader raised."""
    torch.multiprocessing.spawn(_load_another_head, args=(free_port(), str(tmp_path / 'rank')),
                                nprocs=2)
    assert torch.load(tmp_path / 'rank0') and torch.load(tmp_path / 'rank1')
