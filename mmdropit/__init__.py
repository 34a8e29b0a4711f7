"""mmdropit: train deep networks in less memory under MMEngine.

The core is pure PyTorch and works on any ``nn.Module``, with only torch installed::

    import mmdropit
    mmdropit.to_dropit(model, gamma=0.9, strategy='mink')   # in place; returns model
    mmdropit.from_dropit(model)                              # undo, in place
    plan = mmdropit.plan_checkpoints(model, step, budget=0.5)  # step(): forward, returns the loss
    plan.apply(model); plan.remove(model)
    mmdropit.compress_activations(model, bits=8)             # norms, GELUs, attention: int8
    mmdropit.rebuild_activations(model)                      # exact: GELU outputs not kept
    mmdropit.adapt_bits(model, step)                         # 8 / 4 / 2 bits where they matter

When mmengine is installed, importing the package also imports :mod:`mmdropit.engine`: it
registers the MMEngine parts (hooks, optim wrappers, FSDP wrappers, the classification model,
datasets and metric) into MMEngine's root registries and installs the compatibility shims for
mmengine 0.10.7 on torch 2.13, so a config needs only::

    custom_imports = dict(imports=['mmdropit'], allow_failed_imports=False)
"""
from .checkpoint import CheckpointPlan, plan_checkpoints
from .codecs import compress_activations, rebuild_activations, restore_activations
from .dropit import adapt_bits, audit, from_dropit, to_dropit
from .errors import (ConfigError, DataFormatError, DataNotFoundError, EnvironmentProblem,
                     MMDropITError)

__version__ = '0.1.0'

__all__ = ['CheckpointPlan', 'adapt_bits', 'audit', 'compress_activations', 'from_dropit',
           'plan_checkpoints', 'rebuild_activations', 'restore_activations', 'to_dropit',
           'ConfigError', 'DataFormatError', 'DataNotFoundError', 'EnvironmentProblem',
           'MMDropITError',
           '__version__']

try:
    import mmengine  # noqa: F401  (only to know whether the engine can be registered)
except ImportError:  # the pure-PyTorch core alone
    pass
else:
    from . import engine  # noqa: F401  (registrations and shims)

    __all__.append('engine')
