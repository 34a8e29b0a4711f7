"""Plans on real models: gradients, BatchNorm statistics, dropout, in-place ops, keyword
arguments, the cost model against measured peaks, bad budgets, save / load."""
from __future__ import annotations

import copy

import pytest
import timm
import torch
from torch import nn

from mmdropit import ConfigError, plan_checkpoints, to_dropit
from mmdropit.checkpoint import (BUDGET_HELP, CheckpointPlan, ModuleTarget, RunTarget, Target,
                                 is_checkpointed, per_block_plan)
from mmdropit.checkpoint.chain import DEFAULT_GRANULARITY, build_chain
from mmdropit.checkpoint.plan import plan_for_chain
from mmdropit.checkpoint.record import record_step
from mmdropit.checkpoint.targets import walk
from mmdropit.common.blocks import block_sequences
from mmdropit.common.budget import parse_budget
from mmdropit.memory import StepPeakMeter


class _Block(nn.Module):
    """Conv-BN-ReLU-Dropout with a residual; ``scale`` arrives as a keyword argument."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.bn = nn.BatchNorm2d(channels)
        self.act = nn.ReLU(inplace=True)
        self.drop = nn.Dropout(0.3)

    def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
        return x + scale * self.drop(self.act(self.bn(self.conv(x))))


class _Net(nn.Module):
    def __init__(self, channels: int = 8, depth: int = 6) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.blocks = nn.ModuleList(_Block(channels) for _ in range(depth))
        self.head = nn.Linear(channels, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x, scale=0.5)
        return self.head(x.mean((2, 3)))


def _train_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, seed: int = 0):
    torch.manual_seed(seed)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


def _all_targets(plan: CheckpointPlan) -> list[Target]:
    """The plan's targets and those nested in them."""
    return [target for _, target in walk(plan.targets)]


def _assert_same_step(model: nn.Module, plan: CheckpointPlan, x, y) -> None:
    plain = copy.deepcopy(model)
    plan.apply(model)
    loss, grads = _train_step(model, x, y)
    plain_loss, plain_grads = _train_step(plain, x, y)
    torch.testing.assert_close(loss, plain_loss)
    assert grads.keys() == plain_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], plain_grads[name], rtol=1e-4, atol=1e-5)
    for (name, buffer), plain_buffer in zip(model.named_buffers(), plain.buffers()):
        assert torch.equal(buffer, plain_buffer), name  # BN statistics updated once


def _assert_predicted_then_same_step(model: nn.Module, plan: CheckpointPlan, x, y) -> None:
    """The plan's predicted activation peak is within 15% of the one measured with it applied,
    and its step equals the unplanned one (:func:`_assert_same_step`)."""
    plan.apply(model)
    with StepPeakMeter(model) as meter:
        nn.functional.cross_entropy(model(x), y).backward()
    model.zero_grad(set_to_none=True)
    truth = meter.result.activation_peak_bytes
    assert abs(plan.planned.activation_peak - truth) <= 0.15 * truth, (plan.planned, truth)
    plan.remove(model)
    _assert_same_step(model, plan, x, y)


def test_bn_dropout_kwargs_plan_gives_the_same_step():
    torch.manual_seed(0)
    model, x, y = _Net(), torch.randn(4, 3, 16, 16), torch.randint(0, 5, (4,))
    plan = plan_checkpoints(model, lambda: nn.functional.cross_entropy(model(x), y))
    assert plan.targets and all(t.module.startswith('blocks.') for t in _all_targets(plan))
    assert not any(t.module == 'blocks.5' for t in _all_targets(plan))  # never the last segment
    _assert_same_step(model, plan, x, y)
    assert plan.planned.activation_peak < plan.baseline.activation_peak


def test_recording_changes_no_training_state():
    torch.manual_seed(0)
    model, x = _Net(), torch.randn(4, 3, 16, 16)
    buffers = [b.clone() for b in model.buffers()]
    rng = torch.get_rng_state()
    plan_checkpoints(model, lambda: model(x).sum())
    assert all(torch.equal(a, b) for a, b in zip(buffers, model.buffers()))
    assert torch.equal(rng, torch.get_rng_state())
    assert all(p.grad is None for p in model.parameters())


class _Double(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2  # saves nothing: x may change later without harm to plain backward


class _InPlaceAfter(nn.Module):
    """``first``'s input is changed in place after ``first`` ran: no checkpoint may start
    there, since its recomputation would read the changed input."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second, self.third = (
            nn.Sequential(_Double(), nn.Linear(16, 256), nn.GELU(), nn.Linear(256, 16))
            for _ in range(3))
        self.head = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * 1.0
        y = self.first(x)
        x.mul_(2)  # in place, after `first` used x
        return self.head(self.third(self.second(y + x)))


def test_no_checkpoint_starts_at_an_input_changed_in_place():
    torch.manual_seed(0)
    model = _InPlaceAfter()
    x, y = torch.randn(32, 16, requires_grad=True), torch.randint(0, 5, (32,))
    plan = plan_checkpoints(model, lambda: nn.functional.cross_entropy(model(x), y))
    assert not any(t.where == 'first' or (isinstance(t, RunTarget) and t.module == 'first'
                                          and t.first == 0) for t in _all_targets(plan))
    assert any(t.module.startswith('second') for t in _all_targets(plan))
    _assert_same_step(model, plan, x, y)


@pytest.mark.parametrize('name,size,kwargs', [
    ('resnet18', 128, dict(drop_rate=0.2)),
    ('deit_tiny_patch16_224', 64, dict(img_size=64, attn_drop_rate=0.1, proj_drop_rate=0.1)),
])
def test_timm_models_same_gradients_and_predicted_peak_close_to_measured(name, size, kwargs):
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=5, **kwargs)
    x, y = torch.randn(8, 3, size, size), torch.randint(0, 5, (8,))

    def step():
        return nn.functional.cross_entropy(model(x), y)

    plan = plan_checkpoints(model, step)

    def measured() -> int:
        with StepPeakMeter(model) as meter:
            step().backward()
        model.zero_grad(set_to_none=True)
        return meter.result.activation_peak_bytes

    baseline = measured()
    plan.apply(model)
    planned = measured()
    plan.remove(model)
    assert not any(is_checkpointed(m) for m in model.modules())
    for predicted, truth in ((plan.baseline.activation_peak, baseline),
                             (plan.planned.activation_peak, planned)):
        assert abs(predicted - truth) <= 0.15 * truth, (predicted, truth)
    assert planned < 0.6 * baseline
    _assert_same_step(model, plan, x, y)


def test_densenet_layers_fed_a_growing_list_recompute_what_they_saw():
    torch.manual_seed(0)
    model = timm.create_model('densenet121', num_classes=5)
    x, y = torch.randn(2, 3, 32, 32), torch.randint(0, 5, (2,))
    layers = [f'features.denseblock{block}.denselayer{layer}' for block in (1, 2)
              for layer in (1, 2, 5)]
    _assert_same_step(model, CheckpointPlan([ModuleTarget(name) for name in layers]), x, y)


def test_dropit_layers_are_planned_with_their_compact_bytes():
    torch.manual_seed(0)
    model = timm.create_model('deit_tiny_patch16_224', img_size=64, num_classes=5)
    x = torch.randn(4, 3, 64, 64)
    dense = plan_checkpoints(model, lambda: model(x).sum())
    to_dropit(model, gamma=0.9)
    sparse = plan_checkpoints(model, lambda: model(x).sum())
    assert sparse.baseline.activation_peak < 0.9 * dense.baseline.activation_peak
    # at the least-memory end the peak is a backward moment, where a DropIT layer rebuilds its
    # dense input: the plans' peaks are close, but what they keep is DropIT's compact bytes
    assert sparse.planned.kept_bytes < 0.9 * dense.planned.kept_bytes


def test_dropit_layers_rebuilt_inputs_are_counted_in_their_backward():
    """A DropIT layer's backward rebuilds its dense input: the record files it as the layer's
    backward workspace, and the predicted peak stays close to the measured one."""
    torch.manual_seed(0)
    model = to_dropit(timm.create_model('deit_tiny_patch16_224', img_size=64, num_classes=5),
                      gamma=0.9)
    x, y = torch.randn(8, 3, 64, 64), torch.randint(0, 5, (8,))

    def step():
        return nn.functional.cross_entropy(model(x), y)

    record = record_step(model, step)
    fc2 = next(call for call in record.calls if call.name == 'blocks.0.mlp.fc2')
    assert fc2.backward_workspace == 8 * 17 * 768 * 4  # its dense fp32 input
    plan = plan_checkpoints(model, step)
    plan.apply(model)
    with StepPeakMeter(model) as meter:
        step().backward()
    plan.remove(model)
    truth = meter.result.activation_peak_bytes
    assert abs(plan.planned.activation_peak - truth) <= 0.15 * truth


def test_budget_fraction_is_met_and_is_faster_than_least_memory():
    torch.manual_seed(0)
    model, x = _Net(depth=8), torch.randn(8, 3, 16, 16)
    least = plan_checkpoints(model, lambda: model(x).sum())
    half = plan_checkpoints(model, lambda: model(x).sum(), budget=0.7)
    assert half.planned.activation_peak <= 0.7 * half.baseline.activation_peak
    assert half.planned.recompute_seconds <= least.planned.recompute_seconds
    assert least.planned.activation_peak <= half.planned.activation_peak


def test_later_searches_on_one_chain_reuse_the_earlier_ones_and_match_fresh_searches():
    """Plans searched one after another on one chain (as the memory budget does, dozens of
    times) start from the limits solved before; each fits its budget, and is as fast as the
    same search on a fresh chain, to the bisection's resolution."""
    torch.manual_seed(0)
    model, x = _Net(depth=10), torch.randn(8, 3, 16, 16)
    record = record_step(model, lambda: model(x).sum())
    reused = build_chain(record, model)
    for budget in (0.8, 0.4, 0.6, 0.5, 0.6):
        plan = plan_for_chain(reused, budget)
        fresh = plan_for_chain(build_chain(record, model), budget)
        assert plan.planned.activation_peak <= budget * plan.baseline.activation_peak
        assert plan.planned.recompute_seconds <= fresh.planned.recompute_seconds * 1.05 + 1e-9
    assert {key for key in reused.searches} >= {('costs', False), ('space', False)}


def test_impossible_budget_names_the_least_reachable_peak():
    model, x = _Net(), torch.randn(4, 3, 16, 16)
    with pytest.raises(ConfigError, match=r'least activation peak is about [0-9.]+ MiB'):
        plan_checkpoints(model, lambda: model(x).sum(), budget=0.01)


@pytest.mark.parametrize('budget', ['half', 0, 1.5, '4 parsecs', True, -3])
def test_malformed_budgets_are_clear_errors(budget):
    with pytest.raises(ConfigError, match='checkpoint budget is None'):
        parse_budget(budget, BUDGET_HELP)


@pytest.mark.parametrize('budget', [0, '0GB', '0 MiB', -3])
def test_a_budget_of_no_bytes_says_a_size_must_be_above_zero(budget):
    with pytest.raises(ConfigError, match='a size must be above zero bytes'):
        parse_budget(budget, BUDGET_HELP)


def test_a_model_without_checkpointable_units_warns_and_plans_nothing():
    model, x = nn.Linear(4, 2), torch.randn(3, 4)
    with pytest.warns(UserWarning, match='no module of this model can be checkpointed'):
        plan = plan_checkpoints(model, lambda: model(x).sum())
    assert plan.targets == []


def test_plan_saves_loads_prints_and_refuses_a_foreign_model(tmp_path):
    torch.manual_seed(0)
    model, x = _Net(), torch.randn(4, 3, 16, 16)
    plan = plan_checkpoints(model, lambda: model(x).sum())
    plan.save(tmp_path / 'plan.json')
    again = CheckpointPlan.load(tmp_path / 'plan.json')
    assert again == plan
    assert 'checkpoint blocks.' in str(plan) and 'predicted activation peak' in str(plan)
    with pytest.raises(ConfigError, match='names modules the model does not have'):
        again.apply(nn.Sequential(nn.Linear(2, 2)))
    plan.apply(model)
    model.eval()
    with torch.no_grad():
        model(x)  # eval runs the plain forward
    with pytest.raises(ConfigError, match='already has checkpoints'):
        plan_checkpoints(model, lambda: model(x).sum())


class _Lists(nn.Module):
    """A sequence of blocks, two blocks each called on an input of its own (an FPN's laterals),
    a list of blocks called in a loop once per level, and a list of blocks called in a loop
    once (a head), maybe followed by one more layer."""

    def __init__(self, last_layer: bool) -> None:
        super().__init__()
        block = lambda: nn.Sequential(nn.Linear(32, 32), nn.GELU())  # noqa: E731
        self.stem, self.blocks = nn.Linear(16, 32), nn.Sequential(*[block() for _ in range(3)])
        self.laterals = nn.ModuleList(block() for _ in range(2))
        self.per_level = nn.ModuleList(block() for _ in range(2))
        self.head = nn.ModuleList(block() for _ in range(2))
        self.out = nn.Linear(32, 4) if last_layer else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        x = self.laterals[0](x) + self.laterals[1](2 * x)
        levels = [x, 2 * x]
        for level in range(2):  # a detection head's convolutions, run once per level
            for block in self.per_level:
                levels[level] = block(levels[level])
        x = levels[0] + levels[1]
        for block in self.head:
            x = block(x)
        return x if self.out is None else self.out(x)


@pytest.mark.parametrize('last_layer', [True, False])
def test_per_block_checkpointing_takes_lists_of_blocks_called_one_after_another(last_layer):
    """A list of blocks the step calls one after another is checkpointed block by block as a
    sequence is; one whose blocks each take an input of their own is not, nor one called more
    than once; a list (or a
    sequence) one of whose blocks cannot be a checkpoint (here the step's last call) is left out
    whole, and the rest still are."""
    torch.manual_seed(0)
    net, x = _Lists(last_layer), torch.randn(8, 16)
    chain = build_chain(record_step(net, lambda: net(x).sum()), net)  # the sum saves nothing
    assert chain.blocks == ('blocks', 'head')
    plan = per_block_plan(chain, net)
    head = ['head.0', 'head.1'] if last_layer else []
    assert [target.module for target in plan.targets] == ['blocks.0', 'blocks.1', 'blocks.2',
                                                          *head]


def test_per_block_checkpointing_of_a_sequence_of_stages_checkpoints_their_blocks_as_timm_does():
    """A sequence of stages that each hold a sequence of blocks (timm's ConvNeXt, Swin) is
    checkpointed block by block, the modules timm's ``set_grad_checkpointing()`` checkpoints,
    with the same step; so are the stages of EfficientNet, sequences of blocks themselves, one
    block or more (timm checkpoints them block by block too, ``flatten=True``). Stages whose
    blocks hold a third of their parameters or less (CSPDarknet's, beside its cross-stage
    convolutions), or none as direct children (MobileViT's later ones), stay whole."""
    torch.manual_seed(0)
    model = timm.create_model('convnext_atto', num_classes=5)
    x, y = torch.randn(4, 3, 64, 64), torch.randint(0, 5, (4,))
    record = record_step(model, lambda: nn.functional.cross_entropy(model(x), y))
    plan = per_block_plan(build_chain(record, model), model)
    blocks = [f'stages.{stage}.blocks.{index}' for stage, depth in enumerate((2, 2, 6, 2))
              for index in range(depth)]
    assert [target.module for target in plan.targets] == blocks
    _assert_same_step(model, plan, x, y)
    efficientnet = timm.create_model('efficientnet_b0')
    assert [(name, len(stage)) for name, stage in block_sequences(efficientnet)] == [
        (f'blocks.{stage}', depth) for stage, depth in enumerate((1, 2, 2, 3, 3, 4, 1))]
    for arch in ('cspdarknet53', 'mobilevit_xxs'):
        assert [name for name, _ in block_sequences(timm.create_model(arch))] == ['stages']


def test_a_sequence_of_blocks_that_saves_little_is_still_checkpointed_block_by_block():
    """A sequence of blocks saving less than the share at which calls are split into their
    children is split all the same, so that its blocks can be checkpointed one by one."""
    torch.manual_seed(0)
    small = nn.Sequential(*[nn.Sequential(nn.Linear(4, 4), nn.GELU()) for _ in range(3)])
    net = nn.Sequential(nn.Linear(16, 4), small, nn.Linear(4, 1024), nn.GELU(),
                        nn.Linear(1024, 1))
    x = torch.randn(64, 16)
    record = record_step(net, lambda: net(x).sum())
    call = next(call for call in record.calls if call.name == '1')
    assert call.saved_bytes * DEFAULT_GRANULARITY < record.saved_bytes
    plan = per_block_plan(build_chain(record, net), net)
    assert [target.module for target in plan.targets] == ['1.0', '1.1', '1.2']


def test_a_region_given_its_device_tensors_by_keyword_takes_an_empty_one_there_first():
    """torch's checkpoint saves the random state of its positional tensors' devices only (a
    GPU's dropout masks would differ in the recomputation): a region given its tensors on
    another device than the CPU by keyword or in a list takes an empty tensor there first; one
    with such a positional tensor, or on the CPU alone, takes none, unless it keeps its inputs
    in host memory and has no positional tensor (the recomputation's unpacking of what it saved
    marks its place in backward)."""
    from mmdropit.checkpoint.apply import _mark
    from mmdropit.common.host_copies import HostCopies, HostGroup

    meta, cpu = torch.empty(2, device='meta'), torch.empty(2)
    assert _mark((), {'query': meta}, None).device.type == 'meta'
    assert _mark(([meta],), {}, None).device.type == 'meta'
    assert _mark((cpu,), {'query': meta}, None).device.type == 'meta'
    assert _mark((meta,), {'key': meta}, None) is None
    assert _mark((cpu,), {'query': cpu}, None) is None
    host = HostGroup(HostCopies(), copy=False)
    assert _mark((), {'query': cpu}, host).device.type == 'cpu'
    assert _mark((cpu,), {}, host) is None
