"""The models of the OGC paper's table and the figures it reports for them.

Feng & Huang, *Optimal Gradient Checkpoint Search for Arbitrary Computation Graphs* (CVPR 2021),
report in their repository's README one row per model: the batch it was trained at, the peak
memory of a forward and backward pass without and with their checkpoints (parameters and
gradients included, on a GPU), and the step times. :data:`OGC_ROWS` holds those figures;
:func:`ogc_workload` builds the same architecture here from torchvision (random weights, nothing
downloaded) at a smaller batch.

The three CIFAR-10 cell-based models of the paper (NASNet, AmoebaNet and DARTS cells) have no
offline builder. The nearest that can be built are timm's ImageNet cell-based networks:
NASNet-A Large for NASNet, and PNASNet-5 Large (cells from the same NASNet search space) for both
AmoebaNet and DARTS; they run at 64x64 (32x32 is too small for their ImageNet stems).

Example::

    row = OGC_ROWS['resnet50']
    work = ogc_workload(row, scale=8, device=torch.device('cpu'))   # batch 64 / 8 = 8
    print(row.memory_cut, row.time_overhead)                        # 0.63 0.31 (paper)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .workload import Workload


@dataclass(frozen=True)
class OGCRow:
    """One row of the OGC table, and how to build its model here.

    Attributes:
        name: Our name of the row (also the table's model column).
        paper_model: The model the paper measured, as its table names it.
        batch_size: The paper's batch size.
        image_size: The paper's input height and width.
        regular_mib: The paper's peak memory without checkpoints (MB as it prints them).
        ogc_mib: The paper's peak memory with its checkpoints.
        regular_seconds: The paper's step time without checkpoints.
        ogc_seconds: The paper's step time with its checkpoints.
        builder: ``'torchvision:<name>'`` or ``'timm:<name>'``: the architecture built here.
        our_image_size: Input size here, when it differs from the paper's.
        stand_in: Why a different architecture stands in for the paper's ('' when it is the same).
    """

    name: str
    paper_model: str
    batch_size: int
    image_size: int
    regular_mib: float
    ogc_mib: float
    regular_seconds: float
    ogc_seconds: float
    builder: str
    our_image_size: int | None = None
    stand_in: str = ''

    @property
    def memory_cut(self) -> float:
        """The paper's memory cut: 1 - checkpointed peak / regular peak."""
        return 1 - self.ogc_mib / self.regular_mib

    @property
    def time_overhead(self) -> float:
        """The paper's time overhead: checkpointed step time / regular step time - 1."""
        return self.ogc_seconds / self.regular_seconds - 1


_CELLS_NOTE = 'no offline builder of the CIFAR-10 cell network: '
OGC_ROWS: dict[str, OGCRow] = {row.name: row for row in (
    OGCRow('alexnet', 'AlexNet', 1024, 224, 4955, 3287, 0.388, 0.519, 'torchvision:alexnet'),
    OGCRow('vgg11', 'VGG 11', 64, 224, 3577, 2781, 0.266, 0.356, 'torchvision:vgg11'),
    OGCRow('vgg13', 'VGG 13', 64, 224, 5136, 3565, 0.418, 0.558, 'torchvision:vgg13'),
    OGCRow('vgg16', 'VGG 16', 64, 224, 5136, 3565, 0.503, 0.666, 'torchvision:vgg16'),
    OGCRow('vgg19', 'VGG 19', 64, 224, 5189, 3565, 0.581, 0.774, 'torchvision:vgg19'),
    OGCRow('resnet18', 'ResNet 18', 256, 224, 5635, 3677, 0.422, 0.548, 'torchvision:resnet18'),
    OGCRow('resnet34', 'ResNet 34', 128, 224, 4079, 1838, 0.364, 0.493, 'torchvision:resnet34'),
    OGCRow('resnet50', 'ResNet 50', 64, 224, 5323, 1973, 0.394, 0.516, 'torchvision:resnet50'),
    OGCRow('resnet101', 'ResNet 101', 32, 224, 3934, 1024, 0.356, 0.482,
           'torchvision:resnet101'),
    OGCRow('resnet152', 'ResNet 152', 16, 224, 2767, 526, 0.241, 0.331, 'torchvision:resnet152'),
    OGCRow('densenet121', 'DenseNet 121', 32, 224, 4027, 898, 0.218, 0.292,
           'torchvision:densenet121'),
    OGCRow('densenet161', 'DenseNet 161', 16, 224, 3751, 666, 0.252, 0.341,
           'torchvision:densenet161'),
    OGCRow('densenet169', 'DenseNet 169', 32, 224, 4862, 897, 0.270, 0.357,
           'torchvision:densenet169'),
    OGCRow('densenet201', 'DenseNet 201', 16, 224, 3146, 474, 0.200, 0.306,
           'torchvision:densenet201'),
    OGCRow('inception_v3', 'Inception v3', 32, 300, 3074, 881, 0.291, 0.374,
           'torchvision:inception_v3'),
    OGCRow('nasnet', 'NASNet Cifar10', 64, 32, 5832, 1129, 0.408, 0.535, 'timm:nasnetalarge',
           our_image_size=64, stand_in=_CELLS_NOTE + 'NASNet-A Large (same cells, ImageNet)'),
    OGCRow('amoebanet', 'AmoebaNet Cifar10', 64, 32, 4944, 1058, 0.331, 0.450,
           'timm:pnasnet5large', our_image_size=64,
           stand_in=_CELLS_NOTE + 'PNASNet-5 Large (NASNet search-space cells, ImageNet)'),
    OGCRow('darts', 'DARTS Cifar10', 64, 32, 5627, 1115, 0.318, 0.494, 'timm:pnasnet5large',
           our_image_size=64,
           stand_in=_CELLS_NOTE + 'PNASNet-5 Large (NASNet search-space cells, ImageNet)'),
)}
"""The paper's rows (figures from the OGC repository's README), in its order."""


def _build_model(builder: str) -> torch.nn.Module:
    library, arch = builder.split(':')
    if library == 'timm':
        import timm
        return timm.create_model(arch, pretrained=False)
    import torchvision.models as tv_models
    # Inception v3's auxiliary head is off (the loss is the main head's); its truncated-normal
    # initialisation is skipped (slow, and the weights are random anyway).
    options = dict(aux_logits=False, init_weights=False) if arch == 'inception_v3' else {}
    return getattr(tv_models, arch)(weights=None, **options)


def ogc_workload(row: OGCRow, scale: int, device: torch.device) -> Workload:
    """``row``'s model with a synthetic batch of ``row.batch_size // scale`` images (at least 1)
    at ``row.our_image_size or row.image_size``, cross-entropy over 1000 classes.

    Args:
        row: The paper's row.
        scale: The factor the paper's batch size is divided by.
        device: Where the model and the batch live.

    Returns:
        The workload, named ``row.name``.
    """
    model = _build_model(row.builder).to(device).train()
    batch_size = max(1, row.batch_size // scale)
    size = row.our_image_size or row.image_size
    images = torch.randn(batch_size, 3, size, size, device=device)
    labels = torch.randint(0, 1000, (batch_size,), device=device)

    def set_grad_checkpointing(enable: bool) -> None:
        raise NotImplementedError(f'{row.name} has no checkpointing switch of its own')

    return Workload(row.name, model, lambda: F.cross_entropy(model(images), labels),
                    set_grad_checkpointing, batch_size)
