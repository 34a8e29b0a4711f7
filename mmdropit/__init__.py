"""mmdropit: train deep networks in less memory under MMEngine.

Importing the package registers its MMEngine parts (models, datasets, metric, hooks) into
MMEngine's root registries and installs the compatibility shims for mmengine 0.10.7 on
torch 2.13, so a config needs only::

    custom_imports = dict(imports=['mmdropit'], allow_failed_imports=False)
"""
from . import engine
from .errors import ConfigError, DataNotFoundError, EnvironmentProblem, MMDropITError

__version__ = '0.1.0'

__all__ = ['ConfigError', 'DataNotFoundError', 'EnvironmentProblem', 'MMDropITError',
           '__version__', 'engine']
