"""Decode GEMM probe: LDG-fed mma.sync kernel and bare read streams vs the same-traffic copy floor and our rule."""
import ctypes, json, os, sys, time
import torch
sys.path.insert(0, os.getcwd())
from dsv4bench.core.timing import CudaTimer
from dsv4bench.core.ceilings import SameTrafficCopy
from dsv4bench.core.graphs import graph_replay
from sweeps.gemm import LAYERS

out = open(os.path.join(os.environ.get("OUT", "/tmp"), "probe.jsonl"), "w")
def emit(**r):
    out.write(json.dumps(r) + "\n"); out.flush(); print(json.dumps(r), flush=True)

lib = ctypes.CDLL(os.path.join(os.path.dirname(__file__), "probe.so"))
timer = CudaTimer("cuda")
floor = SameTrafficCopy(timer, "cuda")
stream = lambda: ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

def tm(fn):
    rep, why = graph_replay(fn)
    assert rep is not None, why
    return timer.time(rep).median_ms * 1e3

def operands(m, n, k, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    kb, nb = k // 128, -(-n // 128)
    x = (torch.randn(m, k, device="cuda", generator=g) * 3).to(torch.float8_e4m3fn)
    w = (torch.randn(n, k, device="cuda", generator=g) * 3).to(torch.float8_e4m3fn)
    sa = torch.exp2(torch.randint(-4, 4, (m, kb), device="cuda", generator=g).float())
    sw = torch.exp2(torch.randint(-4, 4, (nb, kb), device="cuda", generator=g).float()).contiguous()
    from kernels.gemm.glue import mn_major
    return x, mn_major(sa), w, sw

def oracle(x, sa, w, sw):
    m, k = x.shape; n = w.shape[0]
    xd = x.float() * sa.repeat_interleave(128, 1)
    wd = w.float() * sw.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)
    return xd @ wd.T

def gemv(x, sa, w, sw, y, rt, warps, ks):
    m, k = x.shape; n = w.shape[0]
    e = lib.launch_gemv(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(sa.data_ptr()), sa.stride(1),
                        ctypes.c_void_p(w.data_ptr()), ctypes.c_void_p(sw.data_ptr()), ctypes.c_void_p(y.data_ptr()),
                        m, n, k, ks, rt, warps, stream())
    assert e == 0, f"launch error {e} (rt {rt} warps {warps} ks {ks} m {m})"

from kernels.gemm.family import gemm as ours
CFGS = {1: [(1, 4, 1), (1, 8, 1), (1, 16, 1), (1, 4, 2), (1, 8, 2), (1, 4, 4), (1, 8, 4), (2, 4, 1), (2, 8, 1), (4, 4, 1)],
        64: [(1, 4, 1), (1, 8, 1), (1, 4, 2), (1, 8, 2), (1, 4, 4)]}
junk = torch.zeros(4, dtype=torch.int32, device="cuda")
ms = [int(v) for v in os.environ.get("PROBE_M", "1,8,64").split(",")]
for model, layer, n, k, groups in LAYERS:
    if groups != 1:
        continue
    name = f"{model}.{layer}"
    for m in ms:
        x, sa, w, sw = operands(m, n, k, 1000 + m)
        ref = oracle(x, sa, w, sw)
        kb, nb = k // 128, -(-n // 128)
        nbytes = m * k + 4 * m * kb + n * k + 4 * nb * kb + 2 * m * n
        fl = floor.ms(nbytes) * 1e3
        y0 = ours(x, sa, w, sw)
        err0 = ((y0.float() - ref).norm() / ref.norm()).item()
        t_ours = tm(lambda: ours(x, sa, w, sw, out=y0))
        rec = dict(layer=name, m=m, n=n, k=k, bytes=nbytes, floor_us=round(fl, 2), rule_us=round(t_ours, 2),
                   rule_pct=round(100 * fl / t_ours, 1), rule_err=err0, probe={})
        for rt, warps, ks in CFGS[1 if m <= 8 else 64]:
            if n // (16 * rt) < 8:
                continue
            y = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            try:
                gemv(x, sa, w, sw, y, rt, warps, ks); torch.cuda.synchronize()
            except AssertionError as e:
                rec["probe"][f"{rt}/{warps}/{ks}"] = str(e); continue
            err = ((y.float() - ref).norm() / ref.norm()).item()
            t = tm(lambda: gemv(x, sa, w, sw, y, rt, warps, ks))
            rec["probe"][f"{rt}/{warps}/{ks}"] = [round(t, 2), round(100 * fl / t, 1), float(f"{err:.2e}")]
        wb = n * k
        for ctas, thr in ((132, 512), (264, 512), (528, 256), (1056, 256)):
            t = tm(lambda: lib.launch_ldg(ctypes.c_void_p(w.data_ptr()), ctypes.c_size_t(wb), ctypes.c_void_p(junk.data_ptr()), ctas, thr, stream()))
            rec["probe"][f"ldg{ctas}x{thr}"] = [round(t, 2), round(100 * fl / t, 1)]
        for ctas in (132, 264):
            t = tm(lambda: lib.launch_tma(ctypes.c_void_p(w.data_ptr()), ctypes.c_size_t(wb), ctas, stream()))
            rec["probe"][f"tma{ctas}"] = [round(t, 2), round(100 * fl / t, 1)]
        emit(**rec)
        del x, sa, w, sw, ref
out.close()
