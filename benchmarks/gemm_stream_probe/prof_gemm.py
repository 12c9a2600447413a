"""One layer's decode GEMM for ncu: 4 calls of the rule (profile the 4th), then the bare bulk stream of W and the
same-traffic torch copy, once each after a warm-up."""
import ctypes, os, sys
import torch
sys.path.insert(0, os.getcwd())
from kernels.gemm.family import gemm as ours
from kernels.gemm.glue import mn_major
n, k, m = (int(v) for v in sys.argv[1:4])
kb, nb = k // 128, -(-n // 128)
x = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
w = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
sa = mn_major(torch.ones(m, kb, device="cuda")); sw = torch.ones(nb, kb, device="cuda")
flush = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
y = ours(x, sa, w, sw)
for _ in range(4):
    flush.zero_(); ours(x, sa, w, sw, out=y)
lib = ctypes.CDLL(os.path.join(os.path.dirname(__file__), "probe.so"))
st = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
for _ in range(3):
    flush.zero_(); lib.launch_tma(ctypes.c_void_p(w.data_ptr()), ctypes.c_size_t(n * k), 132, st)
nbytes = m * k + 4 * m * kb + n * k + 4 * nb * kb + 2 * m * n
half = max(4096, -(-nbytes // 2 // 4096) * 4096)
src = torch.empty(half, dtype=torch.uint8, device="cuda"); dst = torch.empty_like(src)
for _ in range(3):
    flush.zero_(); dst.copy_(src)
torch.cuda.synchronize()
