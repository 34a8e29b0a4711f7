"""Measure the memory and time of training steps for a few models under memory-saving variants.

For every (model, variant) pair one training step (forward, backward, SGD step, zero_grad) is
measured three ways: the saved-activation bytes (``SavedTensorMeter``), the peak of the step by
category (``StepPeakMeter``: MemTracker on CPU, the allocator's counters on CUDA) and the step
time, timed alternately with the baseline of the same model in one process once those two steps
have warmed up (the ratio reported is the median of the per-round ratios). Models start from
random weights and see synthetic batches: nothing is downloaded. The default run (all models,
three timed rounds) takes about a quarter of an hour on two CPU cores.

Writes ``benchmark.md``, ``benchmark.png`` and ``benchmark.json`` into ``--out`` and prints the
table.

Example:
    python tools/benchmark.py --quick                         # deit_tiny + resnet50, batch 4
    python tools/benchmark.py --models deit_small,faster_rcnn --steps 5 --device cuda
    python tools/benchmark.py --micro --models deit_small --batch-size 64   # micro-batching

A new memory technique becomes a variant with :func:`mmdropit.memory.register_variant`: a
context manager that applies it to a :class:`~mmdropit.memory.Workload` and undoes it on exit.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from mmdropit import ConfigError
from mmdropit.checkpoint import CheckpointPlan, plan_checkpoints
from mmdropit.dropit import from_dropit, to_dropit
from mmdropit.memory import (BASELINE, VARIANTS, Measurement, Workload, benchmark_workload,
                             compare, markdown_table, plot_ratios, plot_tradeoff,
                             register_variant, write_json)
from mmdropit.memory.micro_batches import SplitDecision, smallest_split
from mmdropit.memory.saved import local_part
from mmdropit.memory.trial_peak import trial_peak
from mmdropit.reporting import progress_bar, provenance, provenance_markdown

DEFAULT_OUT = 'work_dirs/benchmark'
QUICK_MODELS = ('deit_tiny', 'resnet50')
QUICK_BATCH_SIZE = 4
QUICK_STEPS = 1
IMAGE_SIZE = 224
DET_IMAGE_SIZE = (608, 800)  # (height, width): a COCO-sized image after mmdet's resize
DET_BOXES_PER_IMAGE = 3
MIB = 2**20


# ----------------------------------------------------------------------------------------------
# Models: random weights, synthetic batches.
# ----------------------------------------------------------------------------------------------

def _timm_builder(arch: str) -> Callable[[str, int, torch.device], Workload]:
    def build(name: str, batch_size: int, device: torch.device) -> Workload:
        import timm
        model = timm.create_model(arch, pretrained=False).to(device).train()
        images = torch.randn(batch_size, 3, IMAGE_SIZE, IMAGE_SIZE, device=device)
        labels = torch.randint(0, model.num_classes, (batch_size,), device=device)

        def part_loss(first: int, size: int) -> torch.Tensor:
            part = slice(first, first + size)
            return F.cross_entropy(model(images[part]), labels[part]) * (size / batch_size)

        return Workload(name, model, lambda: F.cross_entropy(model(images), labels),
                        model.set_grad_checkpointing, batch_size, part_loss)
    return build


def _detector_part_loss(model: nn.Module, data: dict) -> Callable[[int, int], torch.Tensor]:
    """The weighted loss of a slice of a preprocessed detection batch."""
    batch_size = len(data['data_samples'])

    def part_loss(first: int, size: int) -> torch.Tensor:
        part = slice(first, first + size)
        losses = model(data['inputs'][part], data['data_samples'][part], mode='loss')
        return model.parse_losses(losses)[0] * (size / batch_size)

    return part_loss


def _synthetic_detection_batch(batch_size: int) -> dict:
    from mmdet.structures import DetDataSample
    from mmengine.structures import InstanceData

    generator = torch.Generator().manual_seed(0)
    height, width = DET_IMAGE_SIZE
    size = min(height, width)
    inputs, samples = [], []
    for _ in range(batch_size):
        inputs.append(torch.randint(0, 256, (3, height, width), dtype=torch.uint8,
                                    generator=generator))
        corner = torch.rand(DET_BOXES_PER_IMAGE, 2, generator=generator) * (size * 3 / 4)
        extent = 32 + torch.rand(DET_BOXES_PER_IMAGE, 2, generator=generator) * (size / 4 - 32)
        sample = DetDataSample(metainfo=dict(img_shape=(height, width),
                                             ori_shape=(height, width), scale_factor=(1.0, 1.0)))
        sample.gt_instances = InstanceData(
            bboxes=torch.cat([corner, corner + extent], dim=1),
            labels=torch.randint(0, 80, (DET_BOXES_PER_IMAGE,), generator=generator))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def _build_faster_rcnn(name: str, batch_size: int, device: torch.device) -> Workload:
    import mmdet
    from mmdet.registry import MODELS as MMDET_MODELS
    from mmdet.utils import register_all_modules
    from mmengine.config import Config

    register_all_modules()
    config = Config.fromfile(os.path.join(os.path.dirname(mmdet.__file__), '.mim', 'configs',
                                          'faster_rcnn', 'faster-rcnn_r50_fpn_1x_coco.py'))
    # Weights stay at PyTorch's default initialisation: init_weights() would load the backbone
    # from torchvision:// (a download) and log every parameter.
    model = MMDET_MODELS.build(config.model).to(device).train()
    data = model.data_preprocessor(_synthetic_detection_batch(batch_size), training=True)

    def loss() -> torch.Tensor:
        losses = model(data['inputs'], data['data_samples'], mode='loss')
        return model.parse_losses(losses)[0]

    return Workload(name, model, loss, _grad_checkpointing_switch(model), batch_size,
                    _detector_part_loss(model, data))


def _grad_checkpointing_switch(model: nn.Module) -> Callable[[bool], None]:
    """The library's own checkpointing switch: timm's ``set_grad_checkpointing`` (also inside
    a wrapper such as ``TimmClassifier``) or ``with_cp`` of mmdet's ResNet blocks."""
    from mmdet.models.backbones.resnet import BasicBlock, Bottleneck

    for module in model.modules():
        if hasattr(module, 'set_grad_checkpointing'):
            return module.set_grad_checkpointing
    blocks = [module for module in model.modules()
              if isinstance(module, (Bottleneck, BasicBlock))]

    def set_with_cp(enable: bool) -> None:
        if not blocks:
            raise NotImplementedError(f'{type(model).__name__} has no checkpointing switch')
        for block in blocks:
            block.with_cp = enable

    return set_with_cp


def config_workload(path: str, device: torch.device) -> Workload:
    """A model built from an MMEngine config, with the first batch of its train dataloader.

    Works for any model the config's registries can build (``TimmClassifier``, mmdet
    detectors, ...); the batch size is the config's.
    """
    import mmdropit  # noqa: F401  (registrations and shims)
    from mmengine.config import Config
    from mmengine.registry import MODELS as ENGINE_MODELS
    from mmengine.registry import DefaultScope
    from mmengine.runner import Runner

    cfg = Config.fromfile(path)
    with DefaultScope.overwrite_default_scope(cfg.get('default_scope')):
        model = ENGINE_MODELS.build(cfg.model).to(device).train()
        batch = next(iter(Runner.build_dataloader(cfg.train_dataloader)))
    data = model.data_preprocessor(batch, training=True)

    def loss() -> torch.Tensor:
        return model.parse_losses(model(**data, mode='loss'))[0]

    name = Path(path).stem
    return Workload(name, model, loss, _grad_checkpointing_switch(model),
                    len(data['data_samples']), _detector_part_loss(model, data))


MODELS: dict[str, Callable[[str, int, torch.device], Workload]] = {
    'deit_tiny': _timm_builder('deit_tiny_patch16_224'),
    'deit_small': _timm_builder('deit_small_patch16_224'),
    'deit_base': _timm_builder('deit_base_patch16_224'),
    'resnet50': _timm_builder('resnet50'),
    'densenet121': _timm_builder('densenet121'),
    'faster_rcnn': _build_faster_rcnn,
}
DETECTION_MODELS = ('faster_rcnn',)


def _progress_line(row: dict) -> str:
    def mib(key: str) -> str:
        return 'n/a' if row[key] is None else f'{row[key] / MIB:.1f} MiB'

    def times(key: str) -> str:
        return 'n/a' if row[key] is None else f'x{row[key]:.2f}'

    return (f"  {row['model']:<12} {row['variant']:<14} saved {mib('saved_bytes')} "
            f"({times('saved_ratio')})  peak {mib('peak_bytes')} ({times('peak_ratio')})  "
            f"activation peak {mib('activation_peak_bytes')} ({times('activation_peak_ratio')})  "
            f"step {row['step_seconds']:.3f} s ({times('time_ratio')})")


# ----------------------------------------------------------------------------------------------
# DropIT variants (gamma 0.9, default exclusions: first layer and classifier / predictors).
# ----------------------------------------------------------------------------------------------

DROPIT_GAMMA = 0.9


def _dropit(strategy: str, lean_activations: bool = True):
    @contextlib.contextmanager
    def prepare(work: Workload) -> Iterator[None]:
        to_dropit(work.model, DROPIT_GAMMA, strategy, lean_activations=lean_activations)
        try:
            yield
        finally:
            from_dropit(work.model)
    return prepare


register_variant('dropit-mink', prepare=_dropit('mink'))
register_variant('dropit-approx', prepare=_dropit('mink_approx'))
register_variant('dropit-no-lean', prepare=_dropit('mink', lean_activations=False))


# ----------------------------------------------------------------------------------------------
# Checkpoint-plan variants: planned once per workload (outside the timer), then applied.
# ----------------------------------------------------------------------------------------------

_PLANS: dict[tuple[int, str], CheckpointPlan] = {}


@contextlib.contextmanager
def _applied(plan: CheckpointPlan, model: nn.Module) -> Iterator[None]:
    plan.apply(model)
    try:
        yield
    finally:
        plan.remove(model)


def _checkpoint_plan(budget: float | None, with_dropit: bool = False, objective: str = 'peak'):
    @contextlib.contextmanager
    def prepare(work: Workload) -> Iterator[None]:
        if with_dropit:
            to_dropit(work.model, DROPIT_GAMMA, 'mink')
        key = (id(work.model), f'{budget}-{with_dropit}-{objective}')
        try:
            if key not in _PLANS:
                try:
                    _PLANS[key] = plan_checkpoints(work.model, work.loss, budget,
                                                   objective=objective)
                except ConfigError as error:  # a budget below the least reachable peak
                    raise RuntimeError(str(error)) from error
                print(f'  {work.name}: {_PLANS[key]}'.replace('\n', '\n  '), flush=True)
            with _applied(_PLANS[key], work.model):
                yield
        finally:
            if with_dropit:
                from_dropit(work.model)
    return prepare


register_variant('ckpt-plan-min', prepare=_checkpoint_plan(None))
register_variant('ckpt-plan-0.5', prepare=_checkpoint_plan(0.5))
register_variant('dropit+ckpt-plan-min', prepare=_checkpoint_plan(None, with_dropit=True))


# ----------------------------------------------------------------------------------------------
# The memory-vs-time curve (--curve): the planner at several budgets, and hand-made plans.
# ----------------------------------------------------------------------------------------------

CURVE_BUDGETS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
CURVE_VARIANTS = ('grad-ckpt', 'ckpt-mmengine', 'ckpt-sqrt', 'ckpt-ogc', 'ckpt-plan-min',
                  *(f'ckpt-budget-{budget}' for budget in CURVE_BUDGETS))


def _block_sequences(model: nn.Module) -> list[tuple[str, nn.Sequential]]:
    """The outermost ``nn.Sequential`` modules made of two or more blocks of one class (timm's
    ``blocks``, ResNet stages ``layer1``..``layer4``, mmdet's ``ResLayer``)."""
    found: list[tuple[str, nn.Sequential]] = []
    for name, module in model.named_modules():
        children = list(module.children())
        if (isinstance(module, nn.Sequential) and len(children) >= 2
                and len({type(child) for child in children}) == 1
                and any(True for _ in children[0].parameters())
                and not any(name.startswith(f'{outer}.') for outer, _ in found)):
            found.append((name, module))
    return found


@contextlib.contextmanager
def _mmengine_checkpointing(work: Workload) -> Iterator[None]:
    """MMEngine's own ``activation_checkpointing`` (reentrant checkpoint per listed module),
    listing every block of every block sequence."""
    from mmengine.runner.activation_checkpointing import turn_on_activation_checkpointing

    names = [f'{name}.{index}' if name else str(index)
             for name, sequence in _block_sequences(work.model) for index in range(len(sequence))]
    if not names:
        raise RuntimeError('no nn.Sequential of blocks to list')
    turn_on_activation_checkpointing(work.model, names)
    modules = dict(work.model.named_modules())
    try:
        yield
    finally:
        for name in names:
            del modules[name].forward  # the instance attribute MMEngine set


@contextlib.contextmanager
def _uniform_sqrt(work: Workload) -> Iterator[None]:
    """Checkpoints of about sqrt(n) consecutive blocks (n blocks in all), within each block
    sequence."""
    sequences = _block_sequences(work.model)
    if not sequences:
        raise RuntimeError('no nn.Sequential of blocks to split')
    length = max(1, round(sum(len(seq) for _, seq in sequences) ** 0.5))
    targets = [['run', name, start, min(start + length, len(seq)) - 1]
               for name, seq in sequences for start in range(0, len(seq), length)]
    plan = CheckpointPlan(targets=[t if t[2] < t[3] else ['module', f'{t[1]}.{t[2]}']
                                   for t in targets])
    with _applied(plan, work.model):
        yield


register_variant('ckpt-mmengine', prepare=_mmengine_checkpointing)
register_variant('ckpt-sqrt', prepare=_uniform_sqrt)
register_variant('ckpt-ogc', prepare=_checkpoint_plan(None, objective='ogc'))
for _budget in CURVE_BUDGETS:
    register_variant(f'ckpt-budget-{_budget}', prepare=_checkpoint_plan(_budget))
CURVE_ONLY = ('ckpt-mmengine', 'ckpt-sqrt', 'ckpt-ogc',
              *(f'ckpt-budget-{budget}' for budget in CURVE_BUDGETS))


# ----------------------------------------------------------------------------------------------
# Micro-batching (--micro): the batch as several forward/backward passes and one optimizer step,
# a fixed number of parts or the fewest whose measured peak fits a budget (the search that
# MicroBatchOptimWrapper(memory_budget=...) runs on its first iteration).
# ----------------------------------------------------------------------------------------------

MICRO_BATCHES = 4
MICRO_BUDGET = 0.5
SPLIT_DECISIONS: dict[str, SplitDecision] = {}


def _micro_batches(parts: int | None, inner: Callable | None = None):
    """``parts`` micro-batches (``None``: searched under ``MICRO_BUDGET``), inside the
    ``inner`` variant's preparation."""
    @contextlib.contextmanager
    def prepare(work: Workload) -> Iterator[None]:
        if parts is not None and parts > work.batch_size:
            raise RuntimeError(f'a batch of {work.batch_size} cannot run as {parts} micro-batches')
        with inner(work) if inner else contextlib.nullcontext():
            key = f'{work.name} / {MICRO_BUDGET}'
            if parts is None and key not in SPLIT_DECISIONS:
                SPLIT_DECISIONS[key] = _search_split(work)
                print(f'  {work.name}: {SPLIT_DECISIONS[key]}', flush=True)
            work.micro_batches = parts or SPLIT_DECISIONS[key].micro_batches
            try:
                yield
            finally:
                work.micro_batches = 1
    return prepare


def _search_split(work: Workload) -> SplitDecision:
    if work.part_loss is None:
        raise RuntimeError(f'{work.name} cannot be split into micro-batches')

    def measure(size: int) -> int | None:
        return trial_peak(lambda: work.part_loss(0, size).backward(), work.model, work.optimizer)

    try:
        return smallest_split(work.batch_size, measure, MICRO_BUDGET)
    except ConfigError as error:  # a budget below one sample's peak
        raise RuntimeError(str(error)) from error


register_variant(f'micro-{MICRO_BATCHES}', prepare=_micro_batches(MICRO_BATCHES))
register_variant(f'micro-budget-{MICRO_BUDGET}', prepare=_micro_batches(None))
register_variant(f'dropit+ckpt-plan-min+bf16+micro-{MICRO_BATCHES}',
                 prepare=_micro_batches(MICRO_BATCHES, _checkpoint_plan(None, with_dropit=True)),
                 forward=VARIANTS['bf16-autocast'].forward)
MICRO_VARIANTS = tuple(name for name in VARIANTS if 'micro-' in name)
DEFAULT_VARIANTS = tuple(name for name in VARIANTS
                         if name not in (BASELINE, *CURVE_ONLY, *MICRO_VARIANTS))


# ----------------------------------------------------------------------------------------------
# Command line.
# ----------------------------------------------------------------------------------------------

# ----------------------------------------------------------------------------------------------
# --fsdp: per-rank parameter + gradient + optimizer-state bytes, DDP against FSDP2, on two gloo
# processes (the model sharded by the ShardPolicy that FullyShardModelWrapper uses).
# ----------------------------------------------------------------------------------------------

FSDP_RANKS = 2


def _local_bytes(tensors) -> int:
    parts = [local_part(tensor) for tensor in tensors if tensor is not None]
    return sum(part.numel() * part.element_size() for part in parts)


def _held_by_rank(kind: str, model_name: str) -> dict[str, int]:
    """Bytes this rank holds after one AdamW step of ``model_name`` under DDP or FSDP2.

    A DDP rank holds the whole model, its gradients and optimizer state: measured on the model
    as it is (DDP's communication buckets are not counted, which favours DDP)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from mmdropit.engine.fsdp import ShardPolicy

    torch.manual_seed(0)
    work = MODELS[model_name](model_name, 2, torch.device('cpu'))
    model = work.model
    if kind == 'fsdp2':
        mesh = init_device_mesh('cpu', (dist.get_world_size(),))
        for _, unit in ShardPolicy().units(model):
            fully_shard(unit, mesh=mesh)
        fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    work.loss().backward()
    optimizer.step()
    params = list(model.parameters())
    return dict(parameter=_local_bytes(params), gradient=_local_bytes(p.grad for p in params),
                optimizer_state=_local_bytes(value for state in optimizer.state.values()
                                             for value in state.values()
                                             if isinstance(value, torch.Tensor)))


def _fsdp_rank(rank: int, port: int, model_names: list[str], out: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    dist.init_process_group('gloo', rank=rank, world_size=FSDP_RANKS)
    rows = [dict(model=name, variant=kind, **_held_by_rank(kind, name))
            for name in model_names for kind in ('ddp', 'fsdp2')]
    if rank == 0:
        for row in rows:
            row['held_bytes'] = row['parameter'] + row['gradient'] + row['optimizer_state']
        ddp_bytes = {row['model']: row['held_bytes'] for row in rows if row['variant'] == 'ddp'}
        for row in rows:
            row['held_ratio'] = row['held_bytes'] / (ddp_bytes[row['model']] or 1)
        Path(out).write_text(json.dumps(dict(ranks=FSDP_RANKS, rows=rows), indent=1))
    dist.destroy_process_group()


def run_fsdp(model_names: list[str], out: Path) -> list[dict]:
    """Measure DDP and FSDP2 on ``FSDP_RANKS`` gloo processes; write and return the rows."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        port = sock.getsockname()[1]
    path = out / 'fsdp.json'
    mp.spawn(_fsdp_rank, args=(port, model_names, str(path)), nprocs=FSDP_RANKS)
    saved = dict(json.loads(path.read_text()), provenance=provenance())
    path.write_text(json.dumps(saved, indent=1))
    rows = saved['rows']
    print(f'Bytes held by rank 0 of {FSDP_RANKS} after one AdamW step (MiB):')
    for row in rows:
        print(f"  {row['model']:12} {row['variant']:6} "
              f"parameters {row['parameter'] / MIB:8.1f}  gradients {row['gradient'] / MIB:8.1f}  "
              f"optimizer {row['optimizer_state'] / MIB:8.1f}  total {row['held_bytes'] / MIB:8.1f}"
              f" (x{row['held_ratio']:.2f})")
    print(f'wrote {path}')
    return rows


def _names(text: str, known: dict, what: str) -> list[str]:
    names = [name.strip() for name in text.split(',') if name.strip()]
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise SystemExit(f'unknown {what} {unknown or text!r}; choose from {", ".join(known)}')
    return names


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Read the command line; ``--quick`` fills in what was not given explicitly."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--models', help=f'comma list from {", ".join(MODELS)} (default: all, '
                        'or none when --config is given)')
    parser.add_argument('--config', action='append', default=[],
                        help='also measure the model of this MMEngine config on the first batch '
                        'of its train dataloader (repeatable)')
    parser.add_argument('--variants', default=','.join(DEFAULT_VARIANTS),
                        help=f'comma list from {", ".join(VARIANTS)} (the baseline is always run; '
                        f'default: {", ".join(DEFAULT_VARIANTS)})')
    parser.add_argument('--curve', action='store_true',
                        help='measure the memory-vs-time curve of checkpointing instead: '
                        f'{", ".join(CURVE_VARIANTS)}; also writes checkpoint_curve.png')
    parser.add_argument('--micro', action='store_true',
                        help='measure micro-batching instead: ' + ', '.join(MICRO_VARIANTS))
    parser.add_argument('--fsdp', action='store_true',
                        help='measure the bytes each of %d gloo processes holds under DDP and '
                        'FSDP2 instead (parameters, gradients, AdamW state)' % FSDP_RANKS)
    parser.add_argument('--batch-size', type=int,
                        help='images per step for the classification models (default 16)')
    parser.add_argument('--det-batch-size', type=int, default=2,
                        help='images (%dx%d) per step for detection' % DET_IMAGE_SIZE[::-1])
    parser.add_argument('--steps', type=int, help='timed rounds after the warm-up (default 3)')
    parser.add_argument('--out', default=DEFAULT_OUT, help='output folder')
    parser.add_argument('--device', choices=('cpu', 'cuda'),
                        default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--quick', action='store_true',
                        help=f'{",".join(QUICK_MODELS)} at batch {QUICK_BATCH_SIZE}, '
                             f'{QUICK_STEPS} timed round')
    args = parser.parse_args(argv)
    if args.models or not args.config:
        args.models = _names(args.models or ','.join(QUICK_MODELS if args.quick else MODELS),
                             MODELS, 'model')
    else:
        args.models = []
    missing = [path for path in args.config if not os.path.isfile(path)]
    if missing:
        raise SystemExit(f'config file(s) not found: {", ".join(missing)}')
    if args.curve or args.micro:
        args.variants = list(CURVE_VARIANTS if args.curve else MICRO_VARIANTS)
    else:
        args.variants = _names(args.variants, VARIANTS, 'variant')
    if args.batch_size is None:
        args.batch_size = QUICK_BATCH_SIZE if args.quick else 16
    if args.steps is None:
        args.steps = QUICK_STEPS if args.quick else 3
    if args.steps < 1:
        raise SystemExit('--steps must be at least 1')
    return args


def _write_markdown(path: Path, table: str, meta: dict) -> None:
    on_cuda = meta['device'] == 'cuda'
    peak_source = 'torch.cuda.max_memory_allocated' if on_cuda else 'MemTracker'
    activation = ('not known on CUDA' if on_cuda else
                  'highest activation + temporary bytes at any moment of the step')
    skipped = ''.join(f'- {line}\n' for line in meta['skipped'])
    path.write_text(
        '# Memory benchmark\n\n' + provenance_markdown(meta['provenance']) + '\n'
        f"Device: {meta['device']}. Batch {meta['batch_size']} at {IMAGE_SIZE}x{IMAGE_SIZE} "
        f"(detection: {meta['det_batch_size']} at {DET_IMAGE_SIZE[1]}x{DET_IMAGE_SIZE[0]}), random "
        'weights, synthetic data.\n\n'
        'One step = forward, backward, SGD (momentum) step, zero_grad. *saved*: bytes autograd '
        'keeps for backward during the forward pass, each storage once, parameters excluded. '
        f'*peak*: peak of the step ({peak_source}). *activation peak*: {activation}. '
        f"*step*: median of {meta['timed_rounds']} timed round(s) after the measured steps; its "
        'ratio is the median of per-round ratios, baseline and variants alternated in one '
        'process.\n\n' + table
        + (f'\nSkipped (the variant failed on this model):\n{skipped}' if skipped else ''))


def main(argv: list[str] | None = None) -> list[Measurement] | list[dict]:
    """Run the benchmark and write ``benchmark.md``, ``benchmark.png`` and ``benchmark.json``
    (with ``--fsdp``: ``fsdp.json``, and return its rows)."""
    args = parse_args(argv)
    if args.fsdp:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        return run_fsdp(args.models, Path(args.out))
    warnings.filterwarnings('ignore', message='torch.utils.checkpoint: the use_reentrant')
    device = torch.device(args.device)
    variants = [VARIANTS[BASELINE]] + [VARIANTS[name] for name in args.variants
                                       if name != BASELINE]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    measurements: list[Measurement] = []
    skipped: list[str] = []
    jobs = [*args.models, *args.config]
    with progress_bar() as progress:
        task = progress.add_task('models', total=len(jobs))
        for index, name in enumerate(jobs, start=1):
            torch.manual_seed(args.seed)
            if name in MODELS:
                batch_size = args.det_batch_size if name in DETECTION_MODELS else args.batch_size
                print(f'[{index}/{len(jobs)}] {name}, batch {batch_size}, {args.device}',
                      flush=True)
                work = MODELS[name](name, batch_size, device)
            else:
                print(f'[{index}/{len(jobs)}] {name} (its train batch), {args.device}',
                      flush=True)
                work = config_workload(name, device)
            results, failed = benchmark_workload(work, variants, args.steps, device)
            for row in compare(results, BASELINE):
                print(_progress_line(row), flush=True)
            for line in failed:
                print(f'  skipped {line}', flush=True)
            measurements.extend(results)
            skipped.extend(failed)
            del work
            progress.advance(task)

    table = markdown_table(measurements, BASELINE)
    meta = {
        'provenance': provenance(),
        'device': args.device,
        'batch_size': args.batch_size,
        'det_batch_size': args.det_batch_size,
        'image_size': IMAGE_SIZE,
        'det_image_size': DET_IMAGE_SIZE,
        'timed_rounds': args.steps,
        'seed': args.seed,
        'skipped': skipped,
        'micro_batch_decisions': {key: dict(dataclasses.asdict(decision), text=str(decision))
                                  for key, decision in SPLIT_DECISIONS.items()},
    }
    _write_markdown(out / 'benchmark.md', table, meta)
    write_json(measurements, out / 'benchmark.json', BASELINE, meta)
    plot_ratios(measurements, out / 'benchmark.png', BASELINE)
    if args.curve:
        plot_tradeoff(measurements, out / 'checkpoint_curve.png', BASELINE,
                      curve=('ckpt-plan-min', *(f'ckpt-budget-{b}' for b in CURVE_BUDGETS)))
        print(f'wrote {out / "checkpoint_curve.png"}')
    print()
    print(table, end='')
    print(f'\nwrote {out / "benchmark.md"}, {out / "benchmark.json"}, {out / "benchmark.png"}')
    return measurements


if __name__ == '__main__':
    main()
