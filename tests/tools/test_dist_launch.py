"""``kill -9`` of a part of a ``tools/dist_train.sh`` run (two CPU ranks, gloo): the rest of the
run ends, and says in one line per process what happened and how to go on."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY_VIT, free_port

# One iteration an epoch (64 images, batch 32 on each of two ranks) for far longer than a test
# waits, logging every iteration, no validation.
ENDLESS = ['train_cfg.max_epochs=100000', 'train_dataloader.dataset.indices=64',
           'train_cfg.val_interval=100000', 'default_hooks.logger.interval=1']
WAIT_S = 120  # generous: the machine may be busy


def _state(pid: int) -> str | None:
    """The state letter of process ``pid`` (``'Z'``: ended, not yet reaped), ``None`` if gone."""
    try:
        with open(f'/proc/{pid}/stat') as stream:
            return stream.read().rsplit(')', 1)[1].split()[0]
    except OSError:
        return None


def _running(pid: int) -> bool:
    return _state(pid) not in (None, 'Z')


def _children(pid: int) -> list[int]:
    """The running child processes of ``pid``."""
    children = []
    for name in os.listdir('/proc'):
        try:
            with open(f'/proc/{name}/stat') as stream:
                fields = stream.read().rsplit(')', 1)[1].split()
        except (OSError, ValueError):
            continue
        if int(fields[1]) == pid and fields[0] != 'Z':
            children.append(int(name))
    return children


def _rank(pid: int) -> int:
    with open(f'/proc/{pid}/environ', 'rb') as stream:
        variables = stream.read().split(b'\0')
    return next(int(item[5:]) for item in variables if item.startswith(b'RANK='))


def _wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f'waited {WAIT_S} s for {what}'
        time.sleep(0.2)


@pytest.fixture
def training(tmp_path):
    """A two-rank ``dist_train.sh`` run of the tiny ViT, once both ranks train: ``(torchrun's
    process, {rank: pid}, its output file)``. Whatever is left of it is killed afterwards."""
    output = tmp_path / 'output.txt'
    env = dict(os.environ, PORT=str(free_port()), OMP_NUM_THREADS='1', PYTHONPATH=str(ROOT),
               PATH=f'{Path(sys.executable).parent}{os.pathsep}{os.environ["PATH"]}')
    with open(output, 'w') as stream:
        torchrun = subprocess.Popen(  # dist_train.sh execs torchrun: the same process
            ['bash', 'tools/dist_train.sh', str(TINY_VIT), '2', '--work-dir',
             str(tmp_path / 'work'), '--cfg-options', *ENDLESS],
            cwd=ROOT, env=env, stdout=stream, stderr=subprocess.STDOUT, text=True)
    ranks: dict[int, int] = {}
    try:
        # an iteration logged: both ranks are past their first gradient all-reduce
        _wait_for(lambda: torchrun.poll() is not None or 'Epoch(train)' in output.read_text(),
                  'the first iteration')
        assert torchrun.poll() is None, output.read_text()[-3000:]
        ranks.update({_rank(pid): pid for pid in _children(torchrun.pid)})
        assert sorted(ranks) == [0, 1], ranks
        yield torchrun, ranks, output
    finally:
        for pid in [torchrun.pid, *ranks.values()]:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
        torchrun.wait(timeout=WAIT_S)


def test_the_ranks_end_with_a_killed_torchrun(training):
    torchrun, ranks, output = training
    os.kill(torchrun.pid, signal.SIGKILL)
    torchrun.wait(timeout=WAIT_S)
    _wait_for(lambda: not any(_running(pid) for pid in ranks.values()),
              f'the ranks to end with torchrun; they went on:\n{output.read_text()[-2000:]}')


def test_a_killed_rank_is_one_line_naming_it_and_how_to_resume(training):
    torchrun, ranks, output = training
    os.kill(ranks[1], signal.SIGKILL)
    assert torchrun.wait(timeout=WAIT_S) != 0
    text = output.read_text()
    # rank 0 either noticed (its gradient all-reduce lost its peer) and said so in one line,
    # or torchrun stopped it first; torchrun's own summary names the rank that was killed
    errors = [line for line in text.splitlines() if line.startswith('error:')]
    assert errors in ([], ['error: rank 1 of this run ended early (torchrun names it and its '
                           'exit code in its summary, its log has the cause): once fixed, '
                           'continue with the same command and --resume']), text[-3000:]
    assert 'rank      : 1 (local_rank: 1)' in text and '(SIGKILL)' in text, text[-3000:]
    assert text.count('Traceback') <= 1, text[-3000:]  # torchrun's own, before its summary
