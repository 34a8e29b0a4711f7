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

from mmdropit.common.process_exit import is_running
from tests.conftest import ROOT, TINY_VIT, free_port

# One iteration an epoch (64 images, batch 32 on each of two ranks) for far longer than a test
# waits, logging every iteration, no validation.
ENDLESS = ['train_cfg.max_epochs=100000', 'train_dataloader.dataset.indices=64',
           'train_cfg.val_interval=100000', 'default_hooks.logger.interval=1']
WAIT_S = 120  # generous: the machine may be busy
pytestmark = pytest.mark.skipif(not sys.platform.startswith('linux'),
                                reason="reads /proc; ranks end with torchrun through Linux's prctl")


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


def _rank(pid: int) -> int | None:
    """The ``RANK`` a torchrun worker was given (``None`` until it runs)."""
    try:
        with open(f'/proc/{pid}/environ', 'rb') as stream:
            variables = stream.read().split(b'\0')
    except OSError:
        return None
    return next((int(item[5:]) for item in variables if item.startswith(b'RANK=')), None)


def _wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f'waited {WAIT_S} s for {what}'
        time.sleep(0.2)


class _Run:
    """A two-rank ``dist_train.sh`` run of the tiny ViT, its output in ``{tmp_path}/output.txt``;
    ``torchrun`` is its process (dist_train.sh execs torchrun), ``ranks`` maps each rank to its
    pid once :meth:`wait_for_ranks` has seen them."""

    def __init__(self, tmp_path: Path) -> None:
        self.output = tmp_path / 'output.txt'
        env = dict(os.environ, PORT=str(free_port()), OMP_NUM_THREADS='1', PYTHONPATH=str(ROOT),
                   PATH=f'{Path(sys.executable).parent}{os.pathsep}{os.environ["PATH"]}')
        with open(self.output, 'w') as stream:
            self.torchrun = subprocess.Popen(
                ['bash', 'tools/dist_train.sh', str(TINY_VIT), '2', '--work-dir',
                 str(tmp_path / 'work'), '--cfg-options', *ENDLESS],
                cwd=ROOT, env=env, stdout=stream, stderr=subprocess.STDOUT, text=True)
        self.ranks: dict[int, int] = {}

    def text(self) -> str:
        return self.output.read_text()

    def wait_for_ranks(self) -> None:
        def started() -> bool:
            self.ranks = {_rank(pid): pid for pid in _children(self.torchrun.pid)}
            return sorted(self.ranks, key=str) == [0, 1] or self.torchrun.poll() is not None

        _wait_for(started, 'torchrun to start two ranks')
        assert self.torchrun.poll() is None, self.text()[-3000:]

    def wait_for_training(self) -> None:
        """Until an iteration is logged: both ranks are past their first all-reduce."""
        _wait_for(lambda: self.torchrun.poll() is not None or 'Epoch(train)' in self.text(),
                  'the first iteration')
        assert self.torchrun.poll() is None, self.text()[-3000:]
        self.wait_for_ranks()

    def kill_torchrun_and_wait_for_the_ranks(self) -> None:
        os.kill(self.torchrun.pid, signal.SIGKILL)
        self.torchrun.wait(timeout=WAIT_S)
        _wait_for(lambda: not any(is_running(pid) for pid in self.ranks.values()),
                  f'the ranks to end with torchrun; they went on:\n{self.text()[-2000:]}')

    def kill(self) -> None:
        for pid in [self.torchrun.pid, *self.ranks.values()]:
            if is_running(pid):
                os.kill(pid, signal.SIGKILL)
        self.torchrun.wait(timeout=WAIT_S)


@pytest.fixture
def run(tmp_path):
    """A :class:`_Run` started; whatever is left of it is killed afterwards."""
    started = _Run(tmp_path)
    try:
        yield started
    finally:
        started.kill()


def test_the_ranks_end_with_a_killed_torchrun(run):
    run.wait_for_training()
    run.kill_torchrun_and_wait_for_the_ranks()


def test_ranks_starting_when_torchrun_is_killed_end_too(run):
    """Killed while the ranks import (before they can ask to end with it): they see it gone."""
    run.wait_for_ranks()
    run.kill_torchrun_and_wait_for_the_ranks()
    assert 'Epoch(train)' not in run.text()


def test_a_killed_rank_is_one_line_naming_it_and_how_to_resume(run):
    run.wait_for_training()
    os.kill(run.ranks[1], signal.SIGKILL)
    assert run.torchrun.wait(timeout=WAIT_S) != 0
    text = run.text()
    # rank 0 either noticed (its gradient all-reduce lost its peer) and said so in one line,
    # or torchrun stopped it first; torchrun's own summary names the rank that was killed
    errors = [line for line in text.splitlines() if line.startswith('error:')]
    assert errors in ([], ['error: rank 1 of this run ended early (torchrun names it and its '
                           'exit code in its summary, its log has the cause): once fixed, '
                           'continue with the same command and --resume']), text[-3000:]
    assert 'rank      : 1 (local_rank: 1)' in text and '(SIGKILL)' in text, text[-3000:]
    assert text.count('Traceback') <= 1, text[-3000:]  # torchrun's own, before its summary
