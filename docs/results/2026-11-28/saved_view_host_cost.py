"""Host cost of a converted module's pack and unpack hooks on one saved tensor of 4096 floats
(compute negligible), contiguous and a strided view (attention's layout), one thread.

Run from the repository root: ``PYTHONPATH=. python docs/results/2026-11-28/saved_view_host_cost.py
LABEL``.
"""
import torch, time, sys
torch.set_num_threads(1)
from mmdropit.codecs.activations import _pack, _unpack, Compression
c = Compression('x', 8)
base = torch.randn(3, 4096, requires_grad=False) * 1.0
t = base[0] + 0  # contiguous
q = torch.randn(2, 64, 3, 32).permute(2, 0, 1, 3)[0]  # strided view 2x64x32 = 4096
for name, x in (('contiguous', t), ('view', q)):
    for _ in range(200): _unpack(_pack(c, x))
    n = 2000; s = time.perf_counter()
    for _ in range(n): _unpack(_pack(c, x))
    print(sys.argv[1], name, round((time.perf_counter() - s) / n * 1e6, 1), 'us pack+unpack')
