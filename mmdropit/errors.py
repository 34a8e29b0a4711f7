"""Errors that carry a message a user can act on.

``tools/train.py`` prints these as one line (the full traceback only with ``--debug``).
"""
from __future__ import annotations


class MMDropITError(Exception):
    """Base class: the message says what went wrong and what to do."""


class ConfigError(MMDropITError, ValueError):
    """A config value that cannot work (unknown type, wrong value, missing key)."""


class DataNotFoundError(MMDropITError, FileNotFoundError):
    """A dataset file or folder that does not exist."""


class DataFormatError(MMDropITError, ValueError):
    """A data file that is not in the format its dataset reads (or holds more than data)."""


class EnvironmentProblem(MMDropITError, RuntimeError):
    """A missing or broken installed package (e.g. mmcv without its compiled ops)."""
