"""Checkpoint plans whose top-level checkpoints keep their inputs in host memory: the cost
model's device bytes, the plan file, and every kind of checkpoint training the same step (on a
CPU nothing moves; tests/cuda/test_offload_cuda.py measures the GPU)."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from torch import nn

from mmdropit.checkpoint import (CheckpointPlan, ModuleTarget, Prediction, RunTarget,
                                 SiblingsTarget, build_chain, per_block_plan, plan_for_chain,
                                 predict, record_step)
from mmdropit.common.host_copies import HostCopies
from mmdropit.errors import ConfigError
from tests.helpers.keyword_loop import KeywordLoop
from tests.helpers.shared_input import SharedInput

BLOCKS, BATCH, WIDTH = 6, 512, 64  # a block input of 128 KiB: at least MIN_BYTES


def _blocks_net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Sequential(*[
        nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))
        for _ in range(BLOCKS)]), nn.Linear(WIDTH, 4))


def test_the_device_holds_the_inputs_of_two_checkpoints_and_the_host_all_of_them():
    """Per-block checkpointing keeps every block's input until backward reaches the block; with
    the inputs on the host the device holds the recomputed block's and the one before it (on
    its way back) at the peak, the last block's backward."""
    net, x = _blocks_net(), torch.randn(BATCH, WIDTH)
    chain = build_chain(record_step(net, lambda: net(x).square().mean()), net)
    plan = per_block_plan(chain, net)
    segments = chain.segments_of(plan.targets)
    on_device, on_host = predict(chain, segments), predict(chain, segments, inputs_on_host=True)
    block_input = BATCH * WIDTH * 4
    assert on_device.activation_peak - on_host.activation_peak == (BLOCKS - 2) * block_input
    assert on_host.host_bytes == BLOCKS * block_input and on_device.host_bytes == 0
    assert on_device.kept_bytes - on_host.kept_bytes == BLOCKS * block_input
    assert on_host.recompute_seconds == on_device.recompute_seconds


def test_the_plan_file_says_where_the_inputs_are_and_a_bad_value_is_one_line():
    plan = CheckpointPlan([ModuleTarget('1.0')], inputs_on_host=True)
    assert CheckpointPlan.from_json(plan.to_json()) == plan
    assert 'inputs in host memory' in str(plan)
    assert 'inputs_on_host' not in CheckpointPlan([ModuleTarget('1.0')]).to_json()
    with pytest.raises(ConfigError, match='inputs_on_host is True or False'):
        CheckpointPlan([ModuleTarget('1.0')], inputs_on_host='yes')


class _Chained(nn.Module):
    """Calls three children one after another (a run of siblings)."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.act, self.second = (nn.Linear(WIDTH, WIDTH), nn.GELU(),
                                             nn.Linear(WIDTH, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.act(self.first(x)))


def _gradients(net: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    net.zero_grad(set_to_none=True)
    net(x).square().mean().backward()
    return [parameter.grad.clone() for parameter in net.parameters()]


@pytest.mark.parametrize('targets', [
    [ModuleTarget('0'), ModuleTarget('1.2')],
    [RunTarget('1', 0, 2, inner=(ModuleTarget('1.1'),))],
    [SiblingsTarget('2', ('first', 'act', 'second'))],
], ids=['modules', 'nested-run', 'siblings'])
def test_every_kind_of_checkpoint_trains_the_same_step_with_its_inputs_on_the_host(targets):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Sequential(*[
        nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU()) for _ in range(4)]), _Chained())
    x = torch.randn(BATCH, WIDTH)
    expected = _gradients(net, x)
    with CheckpointPlan(targets, inputs_on_host=True).apply(net) as applied:
        got = _gradients(net, x)
        assert applied.summary.endswith('its inputs in host memory')
        assert applied.host.stats.bytes_moved == 0  # CPU tensors stay where they are
    for value, reference in zip(got, expected):
        torch.testing.assert_close(value, reference, rtol=0, atol=0)


class _Block(nn.Module):
    """A residual MLP block."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(),
                                 nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(x)


class _Passing(nn.Module):
    """Blocks called with their input positionally, by keyword and inside a list."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(WIDTH, WIDTH)
        self.positional, self.keyword, self.listed = _Block(), _KeywordBlock(), _ListBlock()
        self.late = _Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.positional(self.stem(x))
        x = self.keyword(x=x)
        return self.late(self.listed([x]))


class _KeywordBlock(_Block):
    def forward(self, *, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)


class _ListBlock(_Block):
    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        return super().forward(xs[0])


def test_only_positional_inputs_autograd_made_move_to_the_host():
    """torch's checkpoint saves its positional tensors through the saved-tensor hooks, and
    holds keyword arguments and containers itself; the data batch (no ``grad_fn``) is held by
    its caller: the cost model moves only the first kind."""
    torch.manual_seed(0)
    net, x = _Passing(), torch.randn(BATCH, WIDTH)
    chain = build_chain(record_step(net, lambda: net(x).square().mean()), net)
    by_name = {segment.target.module: segment for segment in chain.segments
               if isinstance(segment.target, ModuleTarget) and not segment.selective}
    moved = {name: chain.bytes_of(by_name[name].movable) for name in
             ('stem', 'positional', 'keyword', 'listed')}
    block_input = BATCH * WIDTH * 4
    assert moved == {'stem': 0, 'positional': block_input, 'keyword': 0, 'listed': 0}
    segments = [by_name[name] for name in ('positional', 'keyword', 'listed')]
    on_host = predict(chain, segments, inputs_on_host=True)
    assert on_host.host_bytes == block_input
    assert predict(chain, segments).kept_bytes - on_host.kept_bytes == block_input


def _timed_by_items(net: nn.Module):
    """The chain of ``net``'s step on a batch, each segment's recompute time set to its number
    of items (recorded times of a model this small are noise)."""
    x = torch.randn(BATCH, WIDTH)
    chain = build_chain(record_step(net, lambda: net(x).square().mean()), net)
    chain.segments[:] = [replace(segment, seconds=float(segment.stop - segment.start))
                         for segment in chain.segments]
    return chain


def test_a_budget_searched_with_the_inputs_on_the_host_recomputes_no_more_and_goes_lower():
    """Searched with its inputs in host memory (among the blocks and runs of blocks, or the
    device's plan where that recomputes less), a plan for a budget needs no more recomputation
    than the plan searched on the device, meets budgets no single-level plan on the device
    meets, and its least peak is lower and recomputes less."""
    net = _blocks_net()
    chain = _timed_by_items(net)
    assert chain.blocks == ('1',)
    for budget in (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3):
        host = plan_for_chain(chain, budget, inputs_on_host=True)
        assert host.inputs_on_host and not any(target.inner for target in host.targets)
        assert host.planned.activation_peak <= budget * host.baseline.activation_peak
        assert host.planned.host_bytes > 0
        if budget > 0.3:
            device = plan_for_chain(chain, budget, nested=False)
            assert host.planned.recompute_seconds <= device.planned.recompute_seconds
    with pytest.raises(ConfigError, match='below what any single-level plan reaches'):
        plan_for_chain(chain, 0.3, nested=False)
    least_host = plan_for_chain(chain, None, inputs_on_host=True)
    least_device = plan_for_chain(chain, None, nested=False)
    assert least_host.planned.activation_peak < least_device.planned.activation_peak
    assert least_host.planned.recompute_seconds < least_device.planned.recompute_seconds
    assert {target.where for target in least_host.targets} <= {f'1.{i}' for i in range(BLOCKS)}
    with pytest.raises(ConfigError, match="'ogc' objective plans checkpoints on the device"):
        plan_for_chain(chain, objective='ogc', inputs_on_host=True)


class _ReluBlock(nn.Module):
    """A residual block ending in a ReLU, which saves its output, the next block's input (as a
    ResNet's blocks do)."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(),
                                 nn.Linear(4 * WIDTH, WIDTH))
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(x + self.mlp(x))


class _WideBlock(nn.Module):
    """A residual block four times as wide inside as between blocks, ending in a ReLU."""

    def __init__(self) -> None:
        super().__init__()
        wide = 4 * WIDTH
        self.mlp = nn.Sequential(nn.Linear(WIDTH, wide), nn.GELU(), nn.Linear(wide, wide),
                                 nn.GELU(), nn.Linear(wide, wide), nn.GELU(),
                                 nn.Linear(wide, WIDTH))
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(x + self.mlp(x))


def test_the_search_on_the_host_reaches_what_the_devices_plans_reach_with_it():
    """Blocks whose inputs are a small part of what a plan keeps (a ResNet's, here two wide
    blocks): checkpoints inside a block go lower than whole blocks, and the least peak with the
    inputs on the host is no higher than the device's least single-level plan with its inputs
    on the host."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Sequential(_WideBlock(), _WideBlock()),
                        nn.Linear(WIDTH, 4))
    chain = _timed_by_items(net)
    device = plan_for_chain(chain, None, nested=False).with_inputs_on_host(chain)
    per_block = per_block_plan(chain, net).with_inputs_on_host(chain)
    assert device.planned.activation_peak < per_block.planned.activation_peak
    least = plan_for_chain(chain, None, inputs_on_host=True)
    assert least.planned.activation_peak <= device.planned.activation_peak * 33 // 32


def test_a_model_without_repeated_blocks_moves_its_checkpoints_inputs_too():
    """A model with no repeated blocks gets its plans searched among every checkpoint on the
    device's bytes and predicted with their inputs on the host: the least-memory plan moves
    its checkpoints' inputs, keeps less on the device than the device's least single-level
    plan at no higher a peak, and the step trains the same."""
    torch.manual_seed(0)
    layers = [nn.Linear(WIDTH, 4 * WIDTH)]
    for _ in range(6):
        layers += [nn.GELU(), nn.Linear(4 * WIDTH, 4 * WIDTH)]
    net = nn.Sequential(*layers, nn.GELU(), nn.Linear(4 * WIDTH, 4))
    x = torch.randn(BATCH, WIDTH)
    chain = build_chain(record_step(net, lambda: net(x).square().mean()), net)
    assert not chain.blocks
    device = plan_for_chain(chain, None, nested=False)
    least = plan_for_chain(chain, None, inputs_on_host=True)
    assert least.inputs_on_host and least.planned.host_bytes > 0
    assert least.planned.kept_bytes < device.planned.kept_bytes
    assert least.planned.activation_peak <= device.planned.activation_peak
    plain = _gradients(net, x)
    with least.apply(net):
        planned = _gradients(net, x)
    assert all(torch.equal(got, want) for got, want in zip(planned, plain))


class _ChangesItsInput(nn.Module):
    """Changes a checkpointed block's input in place after the block (what autograd refuses)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.block = nn.Linear(WIDTH, WIDTH), _Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.stem(x)
        out = self.block(hidden)
        hidden.mul_(3)
        return out


@pytest.mark.parametrize('on_host', [False, True])
def test_an_input_changed_in_place_after_its_checkpoint_is_refused_wherever_it_is_kept(on_host):
    """Saved-tensor hooks take autograd's check off what they keep: the host's copies make it
    themselves, also for what stays where it is (here a CPU tensor)."""
    torch.manual_seed(0)
    net = _ChangesItsInput()
    with CheckpointPlan([ModuleTarget('block')], inputs_on_host=on_host).apply(net):
        loss = net(torch.randn(BATCH, WIDTH)).square().mean()
        with pytest.raises(RuntimeError, match='modified by an inplace operation'):
            loss.backward()


def test_an_input_the_block_before_saves_moves_once_that_block_is_checkpointed():
    """The search counts a block's input as moved after a checkpointed block (whose ReLU no
    longer keeps it): its least peak is per-block checkpointing's with the inputs on the host,
    and budgets just above that are met."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(WIDTH, WIDTH),
                        nn.Sequential(*[_ReluBlock() for _ in range(BLOCKS)]),
                        nn.Linear(WIDTH, 4))
    chain = _timed_by_items(net)
    per_block = per_block_plan(chain, net).with_inputs_on_host(chain)
    least = plan_for_chain(chain, None, inputs_on_host=True)
    assert least.planned.activation_peak <= per_block.planned.activation_peak
    budget = per_block.activation_share * 1.05
    assert plan_for_chain(chain, budget, inputs_on_host=True).activation_share <= budget


def test_the_checkpoints_move_their_inputs_in_forward_order_as_far_as_the_link_carries():
    """With room on the link for 3.5 block inputs while the forward pass runs, the first three
    blocks' inputs move and the later ones stay on the device: the device keeps three inputs
    fewer than with none moved, and its peak lies between that and all of them moving."""
    net, x = _blocks_net(), torch.randn(BATCH, WIDTH)
    chain = build_chain(record_step(net, lambda: net(x).square().mean()), net)
    plan = per_block_plan(chain, net)
    segments = chain.segments_of(plan.targets)
    block_input = BATCH * WIDTH * 4
    device, every = predict(chain, segments), predict(chain, segments, True)
    first = predict(chain, segments, True, 3.5 * block_input)
    assert (first.host_checkpoints, every.host_checkpoints, device.host_checkpoints) == \
        ((0, 1, 2), tuple(range(BLOCKS)), ())
    assert first.host_bytes == 3 * block_input
    assert device.kept_bytes - first.kept_bytes == 3 * block_input
    assert every.activation_peak < first.activation_peak < device.activation_peak
    assert predict(chain, segments, True, block_input / 2) == device
    hosted = plan.with_inputs_on_host(chain, 3.5 * block_input)
    assert hosted.host_checkpoints == (0, 1, 2) and hosted.planned == first
    assert plan.with_inputs_on_host(chain).host_checkpoints is None
    assert plan.with_inputs_on_host(chain, block_input / 2) is None  # nothing would move


def test_a_plan_searched_for_a_link_moves_what_it_carries_and_still_fits():
    """Plans searched with their inputs on the host for a link that carries a few block inputs
    move no more than that, in forward order, and still fit their budget; a link
    that carries none gives a plan on the device."""
    net = _blocks_net()
    chain = _timed_by_items(net)
    block_input = BATCH * WIDTH * 4
    baseline = predict(chain, []).activation_peak
    unlimited = plan_for_chain(chain, None, inputs_on_host=True)
    for capacity in (2.5 * block_input, 4.5 * block_input):
        for budget in (None, 0.6, 0.4):
            plan = plan_for_chain(chain, budget, inputs_on_host=True, host_capacity=capacity)
            assert 0 < plan.planned.host_bytes <= capacity
            assert plan.inputs_on_host
            assert (plan.host_checkpoints or tuple(range(len(plan.targets)))) == \
                plan.planned.host_checkpoints
            starts = [segment.start for segment in chain.segments_of(plan.targets)]
            assert starts == sorted(starts)
            if budget is not None:
                assert plan.planned.activation_peak <= budget * baseline
            else:
                assert plan.planned.activation_peak >= unlimited.planned.activation_peak
    on_device = plan_for_chain(chain, 0.6, inputs_on_host=True, host_capacity=block_input / 2)
    assert not on_device.inputs_on_host and on_device.planned.host_bytes == 0
    assert on_device.planned.activation_peak <= 0.6 * baseline


def test_a_plan_moving_some_checkpoints_inputs_applies_so_and_reads_back():
    targets = [ModuleTarget(f'1.{index}') for index in range(BLOCKS)]
    plan = CheckpointPlan(targets, inputs_on_host=True, host_checkpoints=[1, 2])
    assert plan.host_checkpoints == (1, 2)
    assert CheckpointPlan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    assert f'the inputs of 2 of its {BLOCKS} in host memory' in str(plan)
    assert 'host_checkpoints' not in CheckpointPlan(targets, inputs_on_host=True).to_json()
    net = _blocks_net()
    with plan.apply(net) as applied:
        assert applied.summary.endswith(f'the inputs of 2 of its {BLOCKS} in host memory')
        groups = [net[1][index]._mmdropit_host for index in range(BLOCKS)]
        assert all(group.copies is applied.host for group in groups)
        assert [group.copy for group in groups] == [False, True, True] + [False] * (BLOCKS - 3)
    old = {**plan.to_json(), 'host_checkpoints': 2}  # as the versions of 2026-11-29 wrote it
    old['planned'] = {**Prediction(1, 1, 1, 0.0).__dict__, 'host_checkpoints': 2}
    read = CheckpointPlan.from_json(json.loads(json.dumps(old)))
    assert read.host_checkpoints == read.planned.host_checkpoints == (0, 1)
    for bad in ((), (BLOCKS,), (-1, 0), (2, 1), (1, 1), (True,), ('2',), 2):
        with pytest.raises(ConfigError, match='host_checkpoints lists the positions'):
            CheckpointPlan(targets, inputs_on_host=True, host_checkpoints=bad)
    with pytest.raises(ConfigError, match='with inputs_on_host True'):
        CheckpointPlan(targets, host_checkpoints=(2,))


def _mlp_blocks() -> list[nn.Module]:
    return [nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))
            for _ in range(BLOCKS)]


def test_a_checkpoint_whose_copy_frees_nothing_keeps_its_inputs_and_a_data_batch_moves_none():
    """The host's copies take every movable input. The first block's input is the ReLU's
    output, which the ReLU keeps on the device anyway: that checkpoint keeps its inputs there
    and takes none of the link, which carries the next two blocks' inputs. A first checkpoint
    that takes the data batch copies nothing: with room for less than one input nothing moves,
    and the plan is one on the device."""
    torch.manual_seed(0)
    block_input = BATCH * WIDTH * 4
    net = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Sequential(*_mlp_blocks()))
    x = torch.randn(BATCH, WIDTH)
    chain = build_chain(record_step(net, lambda: net(x).square().mean()), net)
    block = per_block_plan(chain, net)
    plan = block.with_inputs_on_host(chain, 2.5 * block_input)
    assert plan.host_checkpoints == (1, 2) and plan.planned.host_bytes == 2 * block_input
    segments = chain.segments_of(plan.targets)
    assert predict(chain, segments, True, 2.5 * block_input).kept_bytes == \
        predict(chain, segments).kept_bytes - 2 * block_input
    assert block.with_inputs_on_host(chain).host_checkpoints == tuple(range(1, BLOCKS))

    torch.manual_seed(0)
    net = nn.Sequential(nn.Sequential(*_mlp_blocks()), nn.Linear(WIDTH, 4))
    chain = _timed_by_items(net)
    block = per_block_plan(chain, net)
    assert block.with_inputs_on_host(chain, block_input / 2) is None
    assert block.with_inputs_on_host(chain, 1.5 * block_input).host_checkpoints == (1,)
    plan = plan_for_chain(chain, None, inputs_on_host=True, host_capacity=block_input / 2)
    assert not plan.inputs_on_host and plan.planned.host_checkpoints == ()


def test_an_input_every_checkpoint_takes_moves_once_and_takes_the_link_once():
    """Four checkpointed blocks each take the one before's output and the encoder's output:
    the encoder's output moves once (the host's copies share it), so a link with room for 3.5
    block inputs carries the first block's two inputs and the second block's own one; the
    third and fourth blocks keep their own inputs on the device and take the encoder's copy,
    so the host keeps three inputs (four, and one on the device, while each copy was counted
    for every checkpoint); with every checkpoint moving, five."""
    torch.manual_seed(0)
    net, x = SharedInput(WIDTH, 4), torch.randn(BATCH, WIDTH)
    chain = build_chain(record_step(net, lambda: net(x).square().mean()), net)
    segments = chain.segments_of([ModuleTarget(f'blocks.{index}') for index in range(4)])
    block_input = BATCH * WIDTH * 4
    assert [chain.bytes_of(segment.movable) for segment in segments] == [2 * block_input] * 4
    first = predict(chain, segments, True, 3.5 * block_input)
    assert first.host_checkpoints == (0, 1) and first.host_bytes == 3 * block_input
    every = predict(chain, segments, True)
    assert every.host_checkpoints == (0, 1, 2, 3) and every.host_bytes == 5 * block_input
    assert predict(chain, segments).kept_bytes - every.kept_bytes == 5 * block_input


class _ReadAgain(nn.Module):
    """Three blocks; a side layer reads (and saves) the second block's input after them."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.side = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)
        self.blocks = nn.ModuleList(_mlp_blocks()[:3])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first = self.stem(x)
        second = self.blocks[0](first)
        return self.blocks[2](self.blocks[1](second)) + self.side(second)


def test_an_input_a_later_layer_keeps_is_in_host_memory_and_on_the_link_all_the_same():
    """The second block's input moves (when its checkpoint runs, nothing keeps it) and a later
    layer keeps it on the device as well: the host holds, and the link carries, all three
    block inputs, the device keeps two fewer than without the host."""
    torch.manual_seed(0)
    net, x = _ReadAgain(), torch.randn(BATCH, WIDTH)
    chain = build_chain(record_step(net, lambda: net(x).square().mean()), net)
    segments = chain.segments_of([ModuleTarget(f'blocks.{index}') for index in range(3)])
    on_host, block_input = predict(chain, segments, True), BATCH * WIDTH * 4
    assert on_host.host_checkpoints == (0, 1, 2) and on_host.host_bytes == 3 * block_input
    assert predict(chain, segments).kept_bytes - on_host.kept_bytes == 2 * block_input


class _KeptAndNot(nn.Module):
    """A checkpointed block taking a ReLU's output, which the ReLU keeps, and a linear layer's,
    which nothing else keeps."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.side, self.head = (nn.Linear(WIDTH, WIDTH) for _ in range(3))
        self.block = _PairBlock()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.stem(x).relu(), self.side(x)))


class _PairBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)

    def forward(self, kept: torch.Tensor, free: torch.Tensor) -> torch.Tensor:
        return self.fc(kept + free)


def test_a_checkpoint_that_copies_takes_the_link_for_every_input_it_copies():
    """The host's copies take both inputs of the block, also the ReLU's output that stays on
    the device for the ReLU: the link must carry two inputs for it to move (with room for 1.5
    nothing moves), the host then holds two and the device one fewer."""
    torch.manual_seed(0)
    net, x = _KeptAndNot(), torch.randn(BATCH, WIDTH)
    chain = build_chain(record_step(net, lambda: net(x).square().mean()), net)
    segments = chain.segments_of([ModuleTarget('block')])
    block_input = BATCH * WIDTH * 4
    assert chain.bytes_of(segments[0].movable) == 2 * block_input
    assert predict(chain, segments, True, 1.5 * block_input).host_checkpoints == ()
    moved = predict(chain, segments, True, 2.5 * block_input)
    assert moved.host_checkpoints == (0,) and moved.host_bytes == 2 * block_input
    assert predict(chain, segments).kept_bytes - moved.kept_bytes == block_input


def test_a_checkpoint_keeping_its_inputs_on_the_device_starts_the_way_back_of_the_one_before(
        monkeypatch):
    """In a plan whose second and fourth checkpoints keep their inputs on the device, backward
    reaching each checkpoint starts the way back of the group before it, also where the block
    takes its input by keyword (it takes an empty tensor first, whose unpacking does it) and
    where it keeps its inputs on the device (on a CPU nothing is copied, so every group starts
    it from its first tensor). The gradients are the plain step's."""
    started: list[int] = []
    monkeypatch.setattr(HostCopies, '_prefetch_group',
                        lambda self, index: started.append(index))
    torch.manual_seed(0)
    net = KeywordLoop((_KeywordBlock() for _ in range(4)), 'x')
    x = torch.randn(BATCH, WIDTH, requires_grad=True)
    plain = _gradients(net, x)
    targets = [ModuleTarget(f'blocks.{index}') for index in range(4)]
    plan = CheckpointPlan(targets, inputs_on_host=True, host_checkpoints=(0, 2))
    with plan.apply(net):
        planned = _gradients(net, x)
    assert started == [2, 1, 0, -1]
    assert all(torch.equal(got, want) for got, want in zip(planned, plain))
