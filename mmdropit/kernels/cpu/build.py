"""Build the fused CPU kernels: ``python -m mmdropit.kernels.cpu.build`` (``make env`` runs it).

Compiles the sources of :data:`~.library.SOURCES` (``dropit_kernels.cpp``, the C++ nodes of
``dropit_linear.cpp``, ``dropit_conv.cpp`` and ``lean_activation.cpp``, the codecs' and the
lean masks' kernels) with torch's ``cpp_extension`` (ninja, the C++ compiler torch was built
for) into :func:`~.library.build_directory` and writes the stamp that lets
:func:`~.library.load` use it.
A second run with the same sources and torch does nothing. Without a C++ compiler or ninja it
prints one line and exits 0: DropIT and the integer codecs then run on their eager paths.
"""
from __future__ import annotations

import shutil
import sys

from .library import (BUILD_COMMAND, CFLAGS, LDFLAGS, NAME, SOURCES, build_directory,
                      library_path, source_stamp, stamp_path, why_not_loadable)


def build(verbose: bool = False) -> bool:
    """Build the library unless an up-to-date one is there; True when it is usable."""
    if why_not_loadable() is None:
        print(f'[mmdropit] fused CPU kernels up to date: {library_path()}')
        return True
    missing = [tool for tool in ('c++', 'ninja') if shutil.which(tool) is None]
    if missing:
        print(f'[mmdropit] warning: no {" or ".join(missing)} on PATH: the fused CPU kernels are '
              f'not built and DropIT and the integer codecs use their eager paths (install them, then run '
              f'`{BUILD_COMMAND}`)')
        return False
    from torch.utils.cpp_extension import load
    folder = build_directory()
    folder.mkdir(parents=True, exist_ok=True)
    stamp_path().unlink(missing_ok=True)
    try:
        load(NAME, [str(path) for path in SOURCES], extra_cflags=list(CFLAGS),
             extra_ldflags=list(LDFLAGS), build_directory=str(folder), is_python_module=False,
             verbose=verbose)
    except (RuntimeError, OSError) as error:  # a compiler error: keep the eager path
        print(f'[mmdropit] warning: building the fused CPU kernels failed '
              f'({str(error).splitlines()[0]}; `{BUILD_COMMAND} --verbose` shows the compiler '
              'output); DropIT and the integer codecs use their eager paths')
        return False
    stamp_path().write_text(source_stamp() + '\n')
    print(f'[mmdropit] fused CPU kernels built: {library_path()}')
    return True


if __name__ == '__main__':
    build(verbose='--verbose' in sys.argv)
