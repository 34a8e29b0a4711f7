"""Top-k accuracy for :class:`TimmClassifier` predictions.

Example config::

    val_evaluator = dict(type='TopKAccuracy', topk=(1, 5))
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from mmengine.evaluator import BaseMetric
from mmengine.registry import METRICS


@METRICS.register_module()
class TopKAccuracy(BaseMetric):
    """Share (in percent) of samples whose label is among the k highest scores.

    Reports ``accuracy/top1`` (and ``accuracy/top5`` etc. for each k in ``topk``).

    Args:
        topk: the k values to report.
        collect_device: ``'cpu'`` or ``'gpu'``, where results are gathered in distributed runs.
        prefix: metric name prefix (default ``'accuracy'``).
    """

    default_prefix = 'accuracy'

    def __init__(self, topk: Sequence[int] = (1,), collect_device: str = 'cpu',
                 prefix: str | None = None) -> None:
        super().__init__(collect_device=collect_device, prefix=prefix)
        if not topk or min(topk) < 1:
            raise ValueError(f'topk must be positive integers, got {topk}')
        self.topk = tuple(topk)

    def process(self, data_batch, data_samples: Sequence[dict]) -> None:
        """Keep, per sample, whether its label is within each top-k."""
        for sample in data_samples:
            score = sample['pred_score']
            label = int(sample['gt_label'])
            ranked = torch.topk(score, k=min(max(self.topk), score.numel())).indices
            self.results.append([label in ranked[:k].tolist() for k in self.topk])

    def compute_metrics(self, results: list) -> dict[str, float]:
        hits = torch.tensor(results, dtype=torch.float64)
        return {f'top{k}': float(hits[:, i].mean() * 100) for i, k in enumerate(self.topk)}
