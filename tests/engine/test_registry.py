"""mmdropit's parts resolve from configs with no scope and under default_scope='mmdet'."""
from __future__ import annotations

import pytest
from mmengine.registry import DATASETS, HOOKS, METRICS, MODELS, TRANSFORMS, DefaultScope

import mmdropit  # noqa: F401

PARTS = [
    (MODELS, 'TimmClassifier'), (MODELS, 'ClsDataPreprocessor'),
    (DATASETS, 'MNIST5kDataset'), (DATASETS, 'CIFAR100Dataset'),
    (DATASETS, 'ImageFolderDataset'), (TRANSFORMS, 'PackClsInputs'),
    (METRICS, 'TopKAccuracy'), (HOOKS, 'MemoryReportHook'), (HOOKS, 'MemoryBudgetHook'),
    (HOOKS, 'CompressActivationsHook'), (HOOKS, 'GraphInt8Hook'),
    (HOOKS, 'ActivationOffloadHook'), (HOOKS, 'RebuiltActivationsHook'),
]


@pytest.mark.parametrize('scope', [None, 'mmdet', 'mmengine'])
@pytest.mark.parametrize('registry,name', PARTS, ids=[name for _, name in PARTS])
def test_resolves_under_scope(registry, name, scope):
    import mmdet.registry  # noqa: F401  (creates the mmdet child registries)

    with DefaultScope.overwrite_default_scope(scope):
        found = registry.get(name)
    assert found is not None and found.__name__ == name
    assert name in registry.module_dict, 'must live in the root registry'


def test_build_under_mmdet_scope_builds_our_model():
    from mmdet.registry import MODELS as MMDET_MODELS

    with DefaultScope.overwrite_default_scope('mmdet'):
        model = MMDET_MODELS.build(dict(
            type='TimmClassifier', model_name='resnet18', num_classes=3))
    assert type(model).__name__ == 'TimmClassifier'
    assert type(model.data_preprocessor).__name__ == 'ClsDataPreprocessor'
