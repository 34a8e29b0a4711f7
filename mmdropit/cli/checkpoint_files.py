"""Checkpoint files as the command lines meet them: truncated or empty ones named in one line,
and a resume that falls back to the newest whole checkpoint when ``last_checkpoint`` is broken.

A kill while MMEngine writes ``last_checkpoint`` leaves it empty or pointing at a file that was
never finished; every ``epoch_*.pth`` / ``iter_*.pth`` before it is still whole.

Example:
    >>> import tempfile, torch
    >>> work_dir = tempfile.mkdtemp()
    >>> torch.save({'meta': {}}, f'{work_dir}/epoch_1.pth')
    >>> _ = open(f'{work_dir}/last_checkpoint', 'w')   # killed while writing it: empty
    >>> path, reason = resume_fallback(work_dir)
    >>> path.endswith('epoch_1.pth'), reason
    (True, 'last_checkpoint is empty')
"""
from __future__ import annotations

import os
import os.path as osp
import zipfile

from torch import nn

from ..errors import ConfigError

LAST = 'last_checkpoint'


def is_whole(path: str) -> bool:
    """Whether ``path`` is a complete checkpoint file (torch's zip format, which a truncated
    write breaks at its end)."""
    return osp.isfile(path) and osp.getsize(path) > 0 and zipfile.is_zipfile(path)


def check_checkpoint(path: str, what: str) -> None:
    """Raise a one-line error when ``path`` (a local file) is not a whole checkpoint.

    Args:
        path: The checkpoint file; remote paths (``scheme://``) are left to MMEngine.
        what: Where it came from, e.g. ``'--resume'`` or ``'load_from'``.

    Raises:
        ConfigError: It is empty, truncated or not a PyTorch checkpoint.
    """
    if '://' in path or not osp.isfile(path) or is_whole(path):
        return
    size = osp.getsize(path)
    state = 'empty' if size == 0 else f'truncated or not a PyTorch checkpoint ({size} bytes)'
    raise ConfigError(f'{what}: checkpoint {path} is {state}; use another checkpoint (the '
                      'work dir keeps every epoch_*/iter_*.pth)')


def resume_fallback(work_dir: str) -> tuple[str | None, str | None]:
    """The checkpoint to resume from when ``{work_dir}/last_checkpoint`` cannot be used.

    Returns:
        ``(None, None)`` when ``last_checkpoint`` names a whole checkpoint (MMEngine resumes
        from it) or the work dir holds no checkpoint at all; otherwise the newest whole
        checkpoint in the work dir (``None`` if there is none) and why ``last_checkpoint`` was
        not used.
    """
    last = osp.join(work_dir, LAST)
    if not osp.isfile(last):
        return None, None
    with open(last) as stream:
        named = stream.read().strip()
    if named and is_whole(named):
        return None, None
    reason = f'{LAST} is empty' if not named else \
        f'{LAST} names {named}, which is {"missing" if not osp.isfile(named) else "truncated"}'
    candidates = [osp.join(work_dir, name) for name in os.listdir(work_dir)
                  if name.endswith('.pth')]
    whole = [path for path in candidates if is_whole(path)]
    return (max(whole, key=osp.getmtime) if whole else None), reason


def check_matches(path: str, model: nn.Module, least: float = 0.5) -> None:
    """Raise a one-line error when the weights in ``path`` are not this model's: fewer than
    ``least`` of the model's ``state_dict`` keys are in the checkpoint (MMEngine only warns of
    missing keys, and the test then scores random weights).

    Raises:
        ConfigError: The checkpoint holds too few of the model's weights.
    """
    import torch

    checkpoint = torch.load(path, map_location='cpu', weights_only=True)
    state = checkpoint.get('state_dict', checkpoint) if isinstance(checkpoint, dict) else {}
    held = {key.removeprefix('module.') for key in state}
    wanted = set(model.state_dict())
    found = len(wanted & held)
    if wanted and found < least * len(wanted):
        raise ConfigError(f'checkpoint {path} holds {found} of the {len(wanted)} weights of this '
                          "config's model: it was trained for another model; check the config "
                          'and the checkpoint')
