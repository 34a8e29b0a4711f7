"""What ``tools/train.py`` and ``tools/test.py`` are made of: common flags, config loading, the
runner, the flags' effect on a config, the environment check and one-line errors.

Needs mmengine (the registered parts of :mod:`mmdropit.engine` are imported on first use).
"""
