"""Where and when a measurement was made: command, date, machine, library versions.

Every table in ``docs/benchmarks.md`` names these; the tools write them into their JSON and
Markdown so that a table cannot lose them.

Example:
    >>> record = provenance(['tools/parity.py', '--suite'])
    >>> record['command']
    'python tools/parity.py --suite'
    >>> sorted(record)[:3]
    ['command', 'cpu', 'cpu_cores']
"""
from __future__ import annotations

import datetime
import os
import platform
import shlex
import sys
from collections.abc import Sequence

import torch


def _cpu_name() -> str:
    try:
        with open('/proc/cpuinfo') as stream:
            for line in stream:
                if line.startswith('model name'):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        return round(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None


def provenance(argv: Sequence[str] | None = None) -> dict:
    """Describe this run: the command line, the UTC date and the machine.

    Args:
        argv: The command line; ``sys.argv`` when not given.

    Returns:
        A JSON-ready dict: ``command``, ``date`` (ISO, UTC), ``cpu``, ``cpu_cores``,
        ``memory_gib``, ``gpu`` (name, or ``None``), ``python``, ``torch`` and ``threads``.
    """
    argv = list(sys.argv if argv is None else argv)
    return {
        'command': 'python ' + shlex.join(argv),
        'date': datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC'),
        'cpu': _cpu_name(),
        'cpu_cores': os.cpu_count(),
        'memory_gib': _memory_gib(),
        'gpu': torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        'python': platform.python_version(),
        'torch': torch.__version__,
        'threads': torch.get_num_threads(),
    }


def provenance_markdown(record: dict) -> str:
    """The record as the Markdown lines that open a results file.

    Example:
        >>> text = provenance_markdown(provenance(['tools/benchmark.py']))
        >>> text.splitlines()[0]
        'Command: `python tools/benchmark.py`'
    """
    device = f"GPU {record['gpu']}" if record.get('gpu') else 'no GPU'
    return (f"Command: `{record['command']}`\n"
            f"Date: {record['date']}\n"
            f"Machine: {record['cpu']}, {record['cpu_cores']} cores, "
            f"{record['memory_gib']} GiB, {device}; Python {record['python']}, "
            f"torch {record['torch']}, {record['threads']} threads\n")
