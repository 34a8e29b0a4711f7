"""The pure-PyTorch core works with torch alone: no mmengine, mmdet, mmcv, timm or cv2."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = ('common', 'codecs', 'kernels', 'dropit', 'checkpoint', 'memory', 'microbatch',
        'offload', 'planner', 'precision')
REFUSED = ('mmengine', 'mmdet', 'mmcv', 'timm', 'cv2', 'pycocotools')

# Runs in a fresh interpreter whose import system refuses the OpenMMLab stack, timm and OpenCV,
# as on a machine where only torch is installed.
SCRIPT = f'''
import sys

REFUSED = {REFUSED!r}


class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in REFUSED:
            raise ModuleNotFoundError(f'No module named {{name!r}} (refused)', name=name)
        return None


sys.meta_path.insert(0, Refuse())

import torch
from torch import nn

import mmdropit
from mmdropit.memory import SavedTensorMeter, StepPeakMeter, trial_peak
from mmdropit.microbatch import search_split
from mmdropit.offload import offload_activations, restore_offload

assert not hasattr(mmdropit, 'engine') and 'mmdropit.engine' not in sys.modules
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), *[nn.Sequential(nn.Linear(64, 64), nn.GELU())
                                           for _ in range(6)], nn.Linear(64, 10))
x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
loss = lambda: nn.functional.cross_entropy(model(x), y)

mmdropit.to_dropit(model, gamma=0.9)
plan = mmdropit.plan_checkpoints(model, loss)
assert plan.targets, plan
plan.apply(model)
with SavedTensorMeter(model) as saved, StepPeakMeter(model) as peak:
    loss().backward()
assert saved.result.total_bytes > 0 and peak.result.activation_peak_bytes > 0
assert all(p.grad is not None for p in model.parameters())
plan.remove(model)
offload_activations(model, ['1', '2'])
loss().backward()
assert restore_offload(model) == ['1', '2']
mmdropit.from_dropit(model)
decision = search_split(16, lambda size: (loss() * size / 16).backward(), model, None, 10**9)
assert decision.micro_batches == 1, decision
assert trial_peak(lambda: loss().backward(), model) > 0
loaded = sorted(name for name in sys.modules if name.split('.')[0] in REFUSED)
assert not loaded, loaded
print('core alone: ok', plan.targets and len(plan.targets))
'''


def test_core_imports_and_works_with_torch_alone():
    run = subprocess.run([sys.executable, '-c', SCRIPT], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert 'core alone: ok' in run.stdout


def _imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split('.')[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split('.')[0])
    return names


def test_no_core_module_imports_the_engine_stack():
    offenders = {
        str(path.relative_to(ROOT)): sorted(_imported_packages(path) & set(REFUSED))
        for package in CORE for path in (ROOT / 'mmdropit' / package).rglob('*.py')}
    assert not {path: names for path, names in offenders.items() if names}


def _relative_imports(path: Path) -> set[str]:
    """The ``mmdropit`` sub-packages that a module of a core package imports relatively."""
    here = path.relative_to(ROOT / 'mmdropit').with_suffix('').parts  # e.g. kernels/cpu/library
    tree = ast.parse(path.read_text(), filename=str(path))
    targets = (here[:len(here) - node.level] + tuple((node.module or node.names[0].name).split('.'))
               for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level)
    return {target[0] for target in targets if target[0] != here[0]}


def test_core_packages_share_helpers_only_through_common():
    """``codecs`` and ``kernels`` are below ``dropit``, and ``kernels`` below ``codecs``:
    DropIT stores its kept values with a codec, and both run their fused kernels where they are
    built."""
    shared = {'common', 'errors'}
    allowed = {'dropit': {'codecs', 'kernels'}, 'codecs': {'kernels'}}
    crossings = {
        str(path.relative_to(ROOT)): sorted(_relative_imports(path) - shared
                                            - allowed.get(package, set()))
        for package in ('codecs', 'kernels', 'dropit', 'checkpoint', 'memory', 'precision')
        for path in (ROOT / 'mmdropit' / package).rglob('*.py')}
    assert not {path: names for path, names in crossings.items() if names}
