"""A checkpoint's recomputation starts from what its first pass started from: list and dict
arguments the region or its caller changes, attributes the forward reassigns, buffers it writes
in place or reassigns — in plain, selective and nested checkpoints — and what cannot be kept is
an error, never a wrong gradient."""
from __future__ import annotations

import copy

import pytest
import timm
import torch
from torch import nn

from mmdropit import plan_checkpoints
from mmdropit.checkpoint import CheckpointPlan, ModuleTarget, RunTarget
from tests.checkpoint.test_plan import _assert_same_step


class _ListStage(nn.Module):
    """Two Linear + Tanh branches that assign into the list they are given (HRNet's pattern)."""

    def __init__(self) -> None:
        super().__init__()
        self.branches = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(2))

    def forward(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        for i, branch in enumerate(self.branches):
            xs[i] = branch(xs[i])
        return xs


class _DictStage(nn.Module):
    """The same with a dict of features, and one more key added to it."""

    def __init__(self) -> None:
        super().__init__()
        self.branches = nn.ModuleDict({key: nn.Sequential(nn.Linear(8, 8), nn.Tanh())
                                       for key in ('low', 'high')})

    def forward(self, feats: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        for key, branch in self.branches.items():
            feats[key] = branch(feats[key])
        feats['sum'] = feats['low'] + feats['high']
        return feats


class _MultiBranch(nn.Module):
    def __init__(self, stage: type[nn.Module]) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 8)
        self.stages = nn.Sequential(stage(), stage(), stage())
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        if isinstance(self.stages[0], _DictStage):
            out = self.stages({'low': x, 'high': 2 * x})
            return self.head(out['low'] + out['high'] + out['sum'])
        out = self.stages([x, 2 * x])
        return self.head(out[0] + out[1])


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(16, 8, generator=generator), torch.randint(0, 5, (16,), generator=generator)


PLANS = {
    'each stage': [ModuleTarget('stages.0'), ModuleTarget('stages.1')],
    'selective': [ModuleTarget('stages.0', selective=True),
                  ModuleTarget('stages.1', selective=True)],
    'run of stages': [RunTarget('stages', 0, 1)],
    'nested in a module': [ModuleTarget('stages', inner=(ModuleTarget('stages.0'),
                                                         ModuleTarget('stages.1')))],
    'nested in a run': [RunTarget('stages', 0, 2, inner=(
        ModuleTarget('stages.1'), ModuleTarget('stages.2', selective=True)))],
}


@pytest.mark.parametrize('stage', [_ListStage, _DictStage])
@pytest.mark.parametrize('targets', list(PLANS.values()), ids=list(PLANS))
def test_stages_that_change_their_container_argument_keep_the_unplanned_gradients(stage,
                                                                                   targets):
    torch.manual_seed(0)
    _assert_same_step(_MultiBranch(stage), CheckpointPlan(list(targets)), *_data())


class _Counted(nn.Module):
    """Reads and reassigns an attribute: each call scales by how often it was called."""

    def __init__(self) -> None:
        super().__init__()
        self.linear, self.calls = nn.Linear(8, 8), 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.last = x.detach()  # a tensor the forward leaves behind
        return torch.tanh(self.linear(x)) * self.calls


class _CountedLinear(nn.Linear):
    """A subclass of one of torch.nn's own classes (whose attributes are not watched) that
    reassigns an attribute: it is watched."""

    def __init__(self) -> None:
        super().__init__(8, 8)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return torch.tanh(super().forward(x)) * self.calls


def _hooked_linear() -> nn.Linear:
    """A module of torch.nn's own (not watched for its own sake) whose forward pre-hook
    reassigns an attribute it then reads: it is watched."""
    linear = nn.Linear(8, 8)
    linear.calls = 0

    def count(module: nn.Linear, args: tuple) -> tuple:
        module.calls += 1
        return (args[0] * module.calls,)

    linear.register_forward_pre_hook(count)
    return linear


class _Tracked(nn.Module):
    """Reads a buffer it writes in place, and one it reassigns."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.register_buffer('written', torch.ones(8))
        self.register_buffer('assigned', torch.ones(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(self.linear(x)) * (self.written * self.assigned)  # saves neither
        self.written.mul_(0.5).add_(y.detach().mean(0))
        self.assigned = self.assigned * 0.5 + 1.0
        return y


class _Stateful(nn.Module):
    def __init__(self, kind: type[nn.Module]) -> None:
        super().__init__()
        self.blocks = nn.Sequential(kind(), kind(), kind())
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


STATE_PLANS = {
    'each block': [ModuleTarget('blocks.0'), ModuleTarget('blocks.1')],
    'selective': [ModuleTarget('blocks.0', selective=True)],
    'nested': [ModuleTarget('blocks', inner=(ModuleTarget('blocks.0'),
                                             ModuleTarget('blocks.1', selective=True)))],
}


@pytest.mark.parametrize('kind', [_Counted, _CountedLinear, _hooked_linear, _Tracked])
@pytest.mark.parametrize('targets', list(STATE_PLANS.values()), ids=list(STATE_PLANS))
def test_state_the_forward_changes_is_seen_by_the_recomputation_as_it_was(kind, targets):
    """Gradients and buffers equal the unplanned step's, over two steps (the second starts from
    the state the first left), and the attributes are those of one forward pass."""
    torch.manual_seed(0)
    model, (x, y) = _Stateful(kind), _data()
    plain = copy.deepcopy(model)
    CheckpointPlan(list(targets)).apply(model)
    for _ in range(2):
        for net in (model, plain):
            nn.functional.cross_entropy(net(x), y).backward()
        for (name, param), plain_param in zip(model.named_parameters(), plain.parameters()):
            torch.testing.assert_close(param.grad, plain_param.grad, rtol=1e-4, atol=1e-5,
                                       msg=name)
        for (name, buffer), plain_buffer in zip(model.named_buffers(), plain.buffers()):
            assert torch.equal(buffer, plain_buffer), name
        model.zero_grad(), plain.zero_grad()
    if kind in (_Counted, _CountedLinear, _hooked_linear):
        assert [block.calls for block in model.blocks] == [2, 2, 2]
    if kind is _Counted:
        assert all(block.last.grad_fn is None for block in model.blocks)


def test_a_forward_hook_registered_after_the_plan_is_watched_too():
    """A forward pre-hook that counts calls on an attribute, put on modules of torch.nn's own
    classes inside the checkpoints after the plan was applied: the recomputation starts from
    the count before the first pass, so the counts are one a forward pass and the gradients
    the unplanned step's."""
    torch.manual_seed(0)
    model, (x, y) = _Stateful(lambda: nn.Sequential(nn.Linear(8, 8), nn.Tanh())), _data()
    plain = copy.deepcopy(model)
    CheckpointPlan(list(STATE_PLANS['each block'])).apply(model)
    nn.functional.cross_entropy(model(x), y).backward()  # a step before the hooks
    model.zero_grad()
    for net in (model, plain):
        for block in net.blocks:
            block[0].calls = 0
            block[0].register_forward_pre_hook(_count_calls)
    for net in (model, plain):
        nn.functional.cross_entropy(net(x), y).backward()
    for (name, param), plain_param in zip(model.named_parameters(), plain.parameters()):
        torch.testing.assert_close(param.grad, plain_param.grad, rtol=1e-4, atol=1e-5,
                                   msg=name)
    assert [block[0].calls for block in model.blocks] == [1, 1, 1]


def _count_calls(module: nn.Module, args: tuple) -> tuple:
    module.calls += 1
    return (args[0] * module.calls,)


def test_a_second_backward_through_the_same_graph_recomputes_from_the_first_pass_again():
    """``backward(retain_graph=True)`` twice: each backward recomputes from the state the first
    pass started from, so the gradients are twice one step's, the attributes those of one
    forward pass (until stop 61 the second entry failed with an AttributeError)."""
    torch.manual_seed(0)
    model, (x, y) = _Stateful(_Counted), _data()
    plain = copy.deepcopy(model)
    CheckpointPlan(list(STATE_PLANS['each block'])).apply(model)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward(retain_graph=True)
    loss.backward()
    nn.functional.cross_entropy(plain(x), y).backward()
    for (name, param), plain_param in zip(model.named_parameters(), plain.parameters()):
        torch.testing.assert_close(param.grad, 2 * plain_param.grad, rtol=1e-4, atol=1e-5,
                                   msg=name)
    assert [block.calls for block in model.blocks] == [1, 1, 1]


class _LateWriter(nn.Module):
    """Writes its buffer in place from its second call on."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.register_buffer('scale', torch.ones(8))
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        y = self.linear(x) * (self.scale * 1.0)  # saves a copy, not the buffer
        if self.calls > 1:
            self.scale.add_(1.0)
        return y


def test_a_buffer_first_written_on_a_later_call_is_an_error_then_is_kept():
    torch.manual_seed(0)
    model, (x, _) = nn.Sequential(_LateWriter()), _data()
    plain = copy.deepcopy(model)
    CheckpointPlan([ModuleTarget('0')]).apply(model)
    for net in (model, plain):
        net(x).sum().backward()
    with pytest.raises(RuntimeError, match=r'wrote the buffer\(s\) scale in place'):
        model(x)
    with torch.no_grad():
        plain(x)  # as far as the refused call went: its forward ran
    for net in (model, plain):
        net.zero_grad()
        net(x).sum().backward()  # copied before the first pass from now on
    torch.testing.assert_close(model[0].linear.weight.grad, plain[0].linear.weight.grad)
    assert torch.equal(model[0].scale, plain[0].scale)


class _SumList(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        return torch.tanh(self.linear(xs[0] + xs[1]))


def test_a_tensor_in_a_list_changed_in_place_after_the_call_is_an_error_not_a_wrong_gradient():
    torch.manual_seed(0)
    model, (x, _) = _SumList(), _data()
    holder = nn.Sequential(model)
    CheckpointPlan([ModuleTarget('0')]).apply(holder)
    xs = [x * 1.0, x * 2.0]
    out = holder(xs)
    xs[1].mul_(3)  # the caller changes a tensor it passed inside the list
    with pytest.raises(RuntimeError, match='a tensor in a list or dict argument was changed'):
        out.sum().backward()


def test_hrnet_stages_which_assign_into_their_list_keep_the_unplanned_gradients():
    torch.manual_seed(0)
    model = timm.create_model('hrnet_w18_small', num_classes=5)
    x, y = torch.randn(2, 3, 64, 64), torch.randint(0, 5, (2,))
    plan = CheckpointPlan([
        ModuleTarget('stage2.0'),
        ModuleTarget('stage3', inner=(ModuleTarget('stage3.0.branches.0'),
                                      ModuleTarget('stage3.0.fuse_layers'))),
        ModuleTarget('stage4.0', selective=True)])
    _assert_same_step(model, plan, x, y)


@pytest.mark.parametrize('name,size', [
    ('hrnet_w18_small', 64),   # multi-resolution stages assign into their list argument
    ('densenet121', 32),       # dense layers read a list their block keeps appending to
    ('vit_tiny_patch16_224', 32),
])
def test_least_memory_plans_of_timm_models_keep_the_unplanned_gradients(name, size):
    torch.manual_seed(0)
    kwargs = {'img_size': size} if name.startswith('vit') else {}
    model = timm.create_model(name, num_classes=5, **kwargs)
    x, y = torch.randn(2, 3, size, size), torch.randint(0, 5, (2,))
    plan = plan_checkpoints(model, lambda: nn.functional.cross_entropy(model(x), y))
    assert plan.targets, str(plan)
    _assert_same_step(model, plan, x, y)
