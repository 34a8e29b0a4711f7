"""Turn the errors users hit most into one line that says what to do.

Used by ``tools/train.py`` and ``tools/test.py``: the first thing a user sees is
``error: ...``, not a traceback from deep inside a library (``--debug`` shows it).
"""
from __future__ import annotations

import re

from ..errors import MMDropITError

_NOT_IN_REGISTRY = re.compile(r'`?(\S+?)`? is not in the (.+?) registry')
_COLLECTIVE_TIMED_OUT = re.compile(r'gloo.*Timed out waiting (\d+)ms')


def explain(exc: BaseException) -> str | None:
    """A one-line explanation of ``exc``, or ``None`` when it is not a known user error (one
    raised in a DataLoader worker is explained by its own message)."""
    message = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    message = _worker_message(message, exc)
    first_line = message.strip().splitlines()[0] if message.strip() else type(exc).__name__
    if isinstance(exc, MMDropITError):
        return first_line
    match = _NOT_IN_REGISTRY.search(message)
    if isinstance(exc, KeyError) and match:
        name, registry = match.groups()
        return (f'unknown type {name!r} in the config ({registry} registry): check the '
                'spelling, or add the module that registers it to custom_imports')
    if isinstance(exc, TypeError) and 'unexpected keyword argument' in message:
        return f'{first_line} -- a config key is misspelt or does not belong there'
    if isinstance(exc, TypeError) and re.search(r'missing \d+ required .*argument', message):
        return f'{first_line} -- give it in the config'
    timed_out = _COLLECTIVE_TIMED_OUT.search(message)
    if isinstance(exc, RuntimeError) and timed_out:
        seconds = int(timed_out.group(1)) / 1000
        return (f'this rank waited {seconds:g} s for another rank in a collective: another rank '
                'failed or hangs (its log says which); if a step, an evaluation or a checkpoint '
                'save really takes longer, raise env_cfg.dist_cfg.timeout (seconds)')
    if isinstance(exc, RuntimeError) and 'gloo' in message and (
            'closed by peer' in message or 'reset by peer' in message):
        return (f'{_other_rank()} of this run ended early (torchrun names it and its exit code '
                'in its summary, its log has the cause): once fixed, continue with the same '
                'command and --resume')
    if isinstance(exc, AssertionError) and 'AmpOptimizerWrapper' in message:
        return ("MMEngine's AmpOptimWrapper needs a GPU: on a CPU use "
                "optim_wrapper=dict(type='MixedPrecisionOptimWrapper', dtype='bfloat16') or --amp")
    if isinstance(exc, ValueError) and message.startswith('batch_size should be a positive'):
        return f'{first_line} -- set train_dataloader.batch_size (and val / test) to 1 or more'
    missing = _missing_module(exc)
    if missing is not None:
        return (f'no module named {missing.name!r}: install it, or, for a module of your own '
                'in custom_imports, run from its directory or add that to PYTHONPATH')
    if isinstance(exc, FileNotFoundError):
        return (f'{first_line} -- check data_root / ann_file / load_from in the config or '
                'override them with --cfg-options')
    return None


def _worker_message(message: str, exc: BaseException) -> str:
    """The error's own message where a DataLoader worker raised it: torch raises it again in
    the main process as ``Caught X in DataLoader worker process N.`` and the worker's
    traceback, which ends with ``module.X: message``; ``message`` as it is otherwise."""
    if not message.startswith('Caught ') or 'Original Traceback' not in message:
        return message
    own = re.compile(rf'^(?:[\w.]+\.)?{re.escape(type(exc).__name__)}: (.*)$')
    found = [match[1] for line in message.splitlines() if (match := own.match(line))]
    return found[-1] if found else message


def _other_rank() -> str:
    """``'rank N'`` for the one other rank of a two-process run, else ``'another rank'`` (gloo
    names only the address of the connection that broke)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() == 2:
        return f'rank {1 - dist.get_rank()}'
    return 'another rank'


def _missing_module(exc: BaseException | None) -> ModuleNotFoundError | None:
    """The ``ModuleNotFoundError`` behind ``exc``: MMEngine's ``custom_imports`` re-raise it
    twice, as ``ImportError``s that list ``sys.path``."""
    while isinstance(exc, ImportError):
        if isinstance(exc, ModuleNotFoundError) and exc.name:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None
