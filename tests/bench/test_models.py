"""The benchmark's synthetic detection batch takes the image size it is given."""
from __future__ import annotations

from mmdropit.bench.models import DET_IMAGE_SIZE, _synthetic_detection_batch


def test_detection_images_have_the_size_asked_for():
    for height, width in (DET_IMAGE_SIZE, (800, 1333)):
        batch = _synthetic_detection_batch(2, (height, width))
        assert [tuple(image.shape) for image in batch['inputs']] == [(3, height, width)] * 2
        sample = batch['data_samples'][0]
        assert sample.img_shape == (height, width)
        boxes = sample.gt_instances.bboxes
        assert boxes.max() <= min(height, width) and boxes.min() >= 0
