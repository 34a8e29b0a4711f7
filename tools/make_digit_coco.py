"""Write the offline "digits on canvas" COCO detection set (real MNIST-5k digits).

Example:
    python tools/make_digit_coco.py --out data/digit_coco --num-train 1000 --num-val 200
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from mmdropit.data.digit_canvas import make_digit_coco


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line.

    Example:
        >>> parse_args(['--canvas', '256', '320']).canvas
        [256, 320]
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--out', default='data/digit_coco', help='root folder of the set')
    parser.add_argument('--num-train', type=int, default=1000, help='train images')
    parser.add_argument('--num-val', type=int, default=200, help='val images')
    parser.add_argument('--seed', type=int, default=0, help='seed of the whole set')
    parser.add_argument('--canvas', type=int, nargs='+', default=[256], metavar='SIDE',
                        help='canvas side, or height and width')
    parser.add_argument('--digits-per-image', type=int, nargs=2, default=[1, 4],
                        metavar=('MIN', 'MAX'), help='digits tried per image')
    parser.add_argument('--scale', type=float, nargs=2, default=[1.0, 2.5],
                        metavar=('LOW', 'HIGH'), help='scale range of the 28x28 digits')
    args = parser.parse_args(argv)
    if len(args.canvas) > 2:
        parser.error('--canvas takes one side or height and width')
    return args


def main(argv: list[str] | None = None) -> None:
    """Generate (or reuse) the set, then print where it is and a one-line summary."""
    args = parse_args(argv)
    canvas = args.canvas * 2 if len(args.canvas) == 1 else args.canvas
    start = time.perf_counter()
    paths = make_digit_coco(args.out, num_train=args.num_train, num_val=args.num_val,
                            canvas_size=canvas, digits_per_image=args.digits_per_image,
                            scale_range=args.scale, seed=args.seed)
    seconds = time.perf_counter() - start
    counts = []
    for split in ('train', 'val'):
        with open(paths[f'{split}_ann']) as stream:
            coco = json.load(stream)
        counts.append(f'{split} {len(coco["images"])} images / {len(coco["annotations"])} digits')
    print(f'digit COCO set in {Path(args.out).resolve()}')
    print(f'{", ".join(counts)}; 10 classes; {seconds:.1f} s')

if __name__ == '__main__':
    main()
