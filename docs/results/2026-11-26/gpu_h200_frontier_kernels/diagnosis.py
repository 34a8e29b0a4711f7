"""One-off GPU diagnosis (session of 2026-11-26, stop 42): codec int8 mismatch, keep_topk
per-kernel times and a PROGRAMS / BLOCK / num_warps sweep."""
import statistics, sys, torch
sys.path.insert(0, '.')
from mmdropit.kernels.switch import eager_only
from mmdropit.codecs.int8 import quantize, dequantize
from mmdropit.kernels.cuda import dropit_kernels as dk
from tests.helpers.kernel_inputs import kernel_input

def ms(fn, reps=10):
    for _ in range(3): fn()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); out.append(a.elapsed_time(b))
    return statistics.median(out)

print('== codec int8 on cuda vs eager')
for numel in (70_001, 1_000_000):
    for dtype in (torch.bfloat16, torch.float32):
        v = kernel_input(numel, dtype, 'normal', 'cuda')
        c, s = quantize(v); r = dequantize(c, s, dtype)
        with eager_only():
            ce, se = quantize(v); re = dequantize(ce, se, dtype)
        bad = (r != re).nonzero().flatten()
        print(numel, dtype, 'codes eq', torch.equal(c, ce), 'scales eq', torch.equal(s, se),
              'codes diff', int((c != ce).sum()), 'scales diff', int((s != se).sum()),
              'rebuilt diff', bad.numel())
        for i in bad[:4].tolist():
            g = i // 32
            print('   i', i, 'v', v[i].item(), 'code', c[i].item(), ce[i].item(), 'scale',
                  s[g].item(), se[g].item(), 'rebuilt', r[i].item(), re[i].item(),
                  'exact', (c[i].float() * s[g]).item())
        # decode only: kernel decode of eager codes vs eager decode
        with eager_only():
            re2 = dequantize(ce, se, dtype)
        r2 = dequantize(ce, se, dtype)
        print('   decode-only diff', int((r2 != re2).sum()))

print('== keep_topk per kernel (bf16 19.4M and fp32 19.4M)')
for dtype in (torch.bfloat16, torch.float32):
    x = torch.randn(256 * 197 * 384, device='cuda', dtype=dtype)
    kept = int(x.numel() * 0.1)
    copy = ms(lambda: torch.empty_like(x).copy_(x))
    print(dtype, 'copy ms', round(copy, 4), 'keep_topk ms', round(ms(lambda: dk.keep_topk(x, kept, True)), 4))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
        for _ in range(5): dk.keep_topk(x, kept, True)
        torch.cuda.synchronize()
    for e in p.key_averages():
        if e.device_time_total > 0:
            print('   ', e.key[:60], e.count, 'avg us', round(e.device_time_total / e.count, 1))

class Warps:
    def __init__(self, fn, w): self.fn, self.w = fn, w
    def __getitem__(self, grid):
        return lambda *a, **k: self.fn[grid](*a, num_warps=self.w, **k)

orig = {n: getattr(dk, n) for n in ('_digit_histogram_kernel', '_count_kernel', '_write_kernel')}
print('== sweep (bf16 and fp32 19.4M): PROGRAMS BLOCK num_warps -> ms')
for dtype in (torch.bfloat16, torch.float32):
    x = torch.randn(256 * 197 * 384, device='cuda', dtype=dtype)
    kept = int(x.numel() * 0.1)
    for programs in (512, 1056, 2112, 4224):
        for block in (1024, 4096):
            for warps in (4, 8):
                dk.PROGRAMS, dk.BLOCK = programs, block
                for n, f in orig.items(): setattr(dk, n, Warps(f, warps))
                try:
                    t = ms(lambda: dk.keep_topk(x, kept, True), reps=5)
                    print(dtype, programs, block, warps, round(t, 4), flush=True)
                except Exception as e:
                    print(dtype, programs, block, warps, 'failed', str(e).splitlines()[0][:100])
