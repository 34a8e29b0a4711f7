"""Checkpoint files as the command lines meet them: truncated or empty ones named in one line,
and a resume that falls back to the latest whole checkpoint when ``last_checkpoint`` is broken
or missing.

A kill while MMEngine writes ``last_checkpoint`` leaves it empty or pointing at a file that was
never finished (the plugin's atomic writes leave the old one, or none on the first write);
every ``epoch_*.pth`` / ``iter_*.pth`` before it is still whole.

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
import re
import zipfile

from torch import nn

from ..errors import ConfigError

LAST = 'last_checkpoint'
_NUMBERED = re.compile(r'(epoch|iter)_(\d+)\.pth')


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
        from it); otherwise the checkpoint to resume from (``None`` if there is none) and why
        ``last_checkpoint`` was not used: where it names a file that is not there, the file of
        that name in the work dir (a work dir moved or copied), else the whole ``epoch_N.pth``
        / ``iter_N.pth`` of the highest ``N`` (a best checkpoint holds no optimizer state).
    """
    last = osp.join(work_dir, LAST)
    named = None  # no last_checkpoint
    if osp.isfile(last):
        with open(last) as stream:
            named = stream.read().strip()
    if named and is_whole(named):
        return None, None
    if named is None:
        reason = f'no {LAST} in the work dir'
    elif not named:
        reason = f'{LAST} is empty'
    else:
        reason = (f'{LAST} names {named}, which is '
                  f'{"missing" if not osp.isfile(named) else "truncated"}')
        moved = osp.join(work_dir, osp.basename(named))
        if not osp.isfile(named) and is_whole(moved):
            return moved, reason
    numbered = [(int(match[2]), osp.join(work_dir, name)) for name in os.listdir(work_dir)
                if (match := _NUMBERED.fullmatch(name))]
    whole = [(number, path) for number, path in numbered if is_whole(path)]
    return (max(whole)[1] if whole else None), reason


def check_matches(path: str, model: nn.Module, least: float = 0.5) -> None:
    """Raise a one-line error when the weights in ``path`` are not this model's (MMEngine only
    warns of missing keys and of shape mismatches, and the test then scores random weights).

    Args:
        path: The checkpoint file.
        model: The model it is loaded into.
        least: The share of the model's ``state_dict`` keys the checkpoint must hold.

    Raises:
        ConfigError: The checkpoint holds fewer than ``least`` of the model's weights (trained
            for another model), or weights of other shapes (the same model with other
            settings, e.g. another width).
    """
    import torch

    checkpoint = torch.load(path, map_location='cpu', weights_only=True)
    state = checkpoint.get('state_dict', checkpoint) if isinstance(checkpoint, dict) else {}
    held = {key.removeprefix('module.'): value for key, value in state.items()}
    wanted = model.state_dict()
    found = [key for key in wanted if key in held]  # in the model's order
    if wanted and len(found) < least * len(wanted):
        raise ConfigError(f'checkpoint {path} holds {len(found)} of the {len(wanted)} weights of '
                          "this config's model: it was trained for another model; check the "
                          'config and the checkpoint')
    shapes = {key: (_shape(held[key]), _shape(wanted[key])) for key in found}
    other = [key for key, (saved, built) in shapes.items() if saved != built]
    if other:
        saved, built = shapes[other[0]]
        raise ConfigError(f'checkpoint {path}: {len(other)} of its weights have other shapes '
                          f"than this config's model's (e.g. {other[0]}: {saved} in the "
                          f'checkpoint, {built} in the model): it was trained with other model '
                          'settings (e.g. another width); check the config and the checkpoint')


def _shape(value: object) -> tuple[int, ...] | None:
    """The shape of a tensor as a tuple; ``None`` for a value that is not a tensor."""
    shape = getattr(value, 'shape', None)
    return None if shape is None else tuple(shape)
