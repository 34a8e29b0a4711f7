"""What DropIT's host code asks of the GPU: its Triton launches, recorded (and, for compiling
them ahead of time, not run), and the PyTorch operations between them that launch kernels of
their own. The tests count them; :mod:`.kernel_speed` replays each launch alone to time it.

Example (on a GPU; with ``TRITON_INTERPRET=1``, as the tests run it, on CPU tensors too):
    >>> import torch
    >>> from mmdropit.kernels.cuda import dropit_kernels
    >>> device = 'cuda' if torch.cuda.is_available() else 'cpu'
    >>> flat = torch.randn(1000, dtype=torch.bfloat16, device=device)
    >>> with recorded_launches(dropit_kernels) as launches:
    ...     _ = dropit_kernels.keep_topk(flat, 100, True)
    >>> [launch.label for launch in launches.triton]
    ['digit_histogram[0]', 'digit_histogram[1]', 'write']
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

# Operations that only make or view a tensor: no kernel runs on a GPU.
_NO_KERNEL = ('empty', 'empty_strided', 'empty_like', 'new_empty', 'view', '_unsafe_view', 'alias',
              'as_strided', 'select', 'slice', 'detach', 'lift_fresh', 't', 'unsqueeze',
              'squeeze', 'expand', '_reshape_alias', 'reshape')


@dataclass(frozen=True)
class Launch:
    """One Triton launch: the kernel, its grid, its runtime arguments and its constants."""

    name: str
    kernel: Any
    grid: tuple
    args: tuple
    constants: dict[str, Any]

    @property
    def label(self) -> str:
        """The kernel's name without its underscore and ``_kernel``, and its pass where it
        has one (``digit_histogram[1]``)."""
        label = self.name.removeprefix('_').removesuffix('_kernel')
        return f'{label}[{self.constants["PASS"]}]' if 'PASS' in self.constants else label

    def argument(self, name: str) -> Any:
        """The runtime argument ``name`` it was given."""
        return dict(zip(self.kernel.arg_names, self.args))[name]

    def replay(self) -> None:
        """Launch it again, with the same grid, arguments and constants."""
        self.kernel[self.grid](*self.args, **self.constants)


@dataclass
class Launches:
    """The Triton launches of a block, and the kernel-launching PyTorch operations between
    them (by name, e.g. ``'zeros'`` shows as ``'zero_'`` or ``'fill_'``)."""

    triton: list[Launch] = field(default_factory=list)
    torch_ops: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.triton) + len(self.torch_ops)


class _Launcher:
    def __init__(self, name: str, kernel: Any, log: Launches, run: bool, state: dict):
        self.name, self.kernel, self.log, self.run, self.state = name, kernel, log, run, state

    def __getitem__(self, grid: tuple):
        def launch(*args, **constants):
            self.log.triton.append(Launch(self.name, self.kernel, tuple(grid), args, constants))
            if self.run:
                self.state['inside'] = True  # the interpreter's own copies are not the host's
                try:
                    self.kernel[grid](*args, **constants)
                finally:
                    self.state['inside'] = False
        return launch


class _TorchOps(TorchDispatchMode):
    def __init__(self, log: Launches, state: dict):
        super().__init__()
        self.log, self.state = log, state

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not self.state['inside'] and name not in _NO_KERNEL:
            self.log.torch_ops.append(name)
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def recorded_launches(module: ModuleType, run: bool = True) -> Iterator[Launches]:
    """Record every launch of ``module``'s Triton kernels (its names ending in ``_kernel``) and
    the PyTorch operations between them inside the block; ``run=False`` records the launches
    without running them (their outputs stay uninitialised)."""
    log, state = Launches(), {'inside': False}
    kernels = {name: getattr(module, name) for name in dir(module) if name.endswith('_kernel')}
    for name, kernel in kernels.items():
        setattr(module, name, _Launcher(name, kernel, log, run, state))
    try:
        with _TorchOps(log, state):
            yield log
    finally:
        for name, kernel in kernels.items():
            setattr(module, name, kernel)
