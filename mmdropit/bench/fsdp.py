"""Bytes each process holds under DDP and under FSDP2: parameters, gradients, optimizer state.

Two gloo processes on this machine each build the model, shard it as ``FullyShardModelWrapper``
does (:class:`~mmdropit.engine.fsdp.ShardPolicy`) or not at all (a DDP rank holds the whole
model), take one AdamW step, and count the local parts of their tensors. DDP's communication
buckets are not counted, which favours DDP.

Example::

    rows = run_fsdp(['deit_tiny'], Path('work_dirs/benchmark'))   # writes fsdp.json
"""
from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..common.parameters import local_part
from ..common.process_exit import end_distributed_process
from ..common.units import mib
from ..reporting import provenance
from .models import MODELS

FSDP_RANKS = 2


def _local_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    parts = [local_part(tensor) for tensor in tensors if tensor is not None]
    return sum(part.numel() * part.element_size() for part in parts)


def _held_by_rank(kind: str, model_name: str) -> dict[str, int]:
    """Bytes this rank holds after one AdamW step of ``model_name`` under DDP or FSDP2."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from ..engine.fsdp import ShardPolicy

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
    end_distributed_process()


def run_fsdp(model_names: list[str], out: Path) -> list[dict]:
    """Measure DDP and FSDP2 on :data:`FSDP_RANKS` gloo processes; write ``out / fsdp.json``,
    print the rows and return them."""
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
              f"parameters {mib(row['parameter'], unit=False):>8}  "
              f"gradients {mib(row['gradient'], unit=False):>8}  "
              f"optimizer {mib(row['optimizer_state'], unit=False):>8}  "
              f"total {mib(row['held_bytes'], unit=False):>8}"
              f" (x{row['held_ratio']:.2f})")
    print(f'wrote {path}')
    return rows
