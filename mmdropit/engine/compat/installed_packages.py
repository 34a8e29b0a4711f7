"""Find installed packages without ``pkg_resources``.

MMEngine 0.10.7 resolves ``mmdet::`` base configs (``_base_ = 'mmdet::faster_rcnn/...'``)
through ``pkg_resources``, which setuptools 81 removed and which is slow where it exists.
This shim answers the same two questions with ``importlib.metadata``.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os.path as osp


def is_installed(package: str) -> bool:
    """Whether ``package`` is installed (as a distribution or an importable module)."""
    try:
        importlib.metadata.distribution(package)
        return True
    except importlib.metadata.PackageNotFoundError:
        spec = importlib.util.find_spec(package)
        return spec is not None and spec.origin is not None


def get_installed_path(package: str) -> str:
    """Folder of the installed module ``package`` (e.g. ``.../site-packages/mmdet``).

    Raises:
        ModuleNotFoundError: ``package`` is neither installed nor importable.
    """
    spec = importlib.util.find_spec(package)
    if spec is None:
        try:
            top_level = importlib.metadata.distribution(package).read_text('top_level.txt')
        except importlib.metadata.PackageNotFoundError:
            top_level = None
        module = (top_level or '').split()[0] if top_level else None
        spec = importlib.util.find_spec(module) if module else None
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(
            f'cannot find the installed package {package!r}: install it to use '
            f'{package}:: configs')
    return osp.dirname(spec.origin)


def install() -> None:
    """Point MMEngine's config loader and hub at these functions."""
    import mmengine.config.config as config_module
    import mmengine.hub.hub as hub_module
    import mmengine.utils as utils_module
    import mmengine.utils.package_utils as package_utils

    for module in (package_utils, utils_module, config_module, hub_module):
        if hasattr(module, 'get_installed_path'):
            module.get_installed_path = get_installed_path
        if hasattr(module, 'is_installed'):
            module.is_installed = is_installed
