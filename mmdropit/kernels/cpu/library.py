"""Where the fused CPU kernels are built, whether the built library matches, and loading it.

The library is built into ``$MMDROPIT_KERNELS_DIR`` or, by default, a folder named after the
torch version and the sources' stamp under torch's extension root (``$TORCH_EXTENSIONS_DIR``,
else ``$XDG_CACHE_HOME/torch_extensions``, ``~/.cache/torch_extensions``), so that checkouts of
different sources on one machine never replace each other's build. A stamp beside it records
a hash of the C++ sources, the compiler flags and the torch version; a library whose stamp
differs (a source changed, torch was upgraded) is not loaded. :mod:`..switch` turns the kernels
off for comparisons.

Example:
    >>> library_path().name
    'mmdropit_cpu_kernels.so'
"""
from __future__ import annotations

import functools
import hashlib
import os
import warnings
from pathlib import Path

import torch

from ..switch import fused_enabled

NAME = 'mmdropit_cpu_kernels'
_HERE = Path(__file__).parent
SOURCES = (_HERE / 'dropit_kernels.cpp', _HERE / 'dropit_linear.cpp', _HERE / 'dropit_conv.cpp',
           _HERE / 'lean_mask_kernels.cpp', _HERE / 'lean_activation.cpp',
           _HERE / 'derivative_code_kernels.cpp', _HERE / 'int8_kernels.cpp',
           _HERE / 'low_bit_kernels.cpp')
HEADERS = (_HERE / 'avx512_paths.h', _HERE / 'chunks.h', _HERE / 'codec_groups.h',
           _HERE / 'dispatched_ops.h', _HERE / 'selection_keys.h', _HERE / 'threshold_search.h')
CFLAGS = ('-O3', '-fopenmp', '-ffp-contract=off')  # no fused multiply-add: eager's rounding
LDFLAGS = ('-fopenmp',)
BUILD_COMMAND = 'python -m mmdropit.kernels.cpu.build'


def build_directory() -> Path:
    """The folder the library is built in and loaded from."""
    chosen = os.environ.get('MMDROPIT_KERNELS_DIR')
    if chosen:
        return Path(chosen)
    root = os.environ.get('TORCH_EXTENSIONS_DIR') or Path(
        os.environ.get('XDG_CACHE_HOME') or Path.home() / '.cache') / 'torch_extensions'
    version = torch.__version__.replace('+', '_')
    return Path(root) / f'{NAME}_torch{version}_{source_stamp()[:12]}'


def library_path() -> Path:
    """The shared library's path inside :func:`build_directory`."""
    return build_directory() / f'{NAME}.so'


@functools.cache
def source_stamp() -> str:
    """A hash of what the library is built from: sources, flags and torch version."""
    digest = hashlib.sha256()
    for path in (*SOURCES, *HEADERS):
        digest.update(path.read_bytes())
    digest.update(' '.join((*CFLAGS, *LDFLAGS, torch.__version__)).encode())
    return digest.hexdigest()


def stamp_path() -> Path:
    """The file beside the library that holds :func:`source_stamp` of its build."""
    return build_directory() / f'{NAME}.stamp'


def why_not_loadable() -> str | None:
    """Why the built library cannot be loaded (``None`` when it is there and current)."""
    if not library_path().is_file():
        return 'they are not built'
    if not stamp_path().is_file() or stamp_path().read_text().strip() != source_stamp():
        return 'the built library is for another torch or an older source'
    return None


@functools.cache
def load() -> bool:
    """Load the fused kernels once; True when ``torch.ops.mmdropit_cpu`` is usable.

    When they cannot be loaded, one warning line says why and how to build them, and DropIT
    and the integer codecs stay on their eager paths.
    """
    problem = why_not_loadable()
    if problem is None:
        try:
            torch.ops.load_library(str(library_path()))
            return True
        except OSError as error:
            problem = f'loading failed ({str(error).splitlines()[0]})'
    warnings.warn(f"mmdropit: the fused CPU kernels are not used: {problem}; build them "
                  f'with `{BUILD_COMMAND}` (or `make env`). DropIT and the integer codecs run '
                  'on their slower eager paths meanwhile.', stacklevel=2)
    return False


DTYPES = frozenset((torch.float32, torch.float64, torch.bfloat16, torch.float16))
"""Input dtypes the kernels take."""


def usable(x: torch.Tensor) -> bool:
    """Whether the fused kernels can run on ``x`` (a floating CPU tensor, kernels loaded)."""
    return x.is_cpu and x.dtype in DTYPES and fused_enabled() and load()
