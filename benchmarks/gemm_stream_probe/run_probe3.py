"""The W stream's TMA shape: 2-D bn x 128 boxes by L2 promotion, and 3-D boxes of kk K blocks in one copy (the same
shared-memory layout the wgmma reads), each as a bare stream beside the floor and the rule, one process."""
import ctypes, json, os, sys
import torch
sys.path.insert(0, os.getcwd())
from dsv4bench.core.timing import CudaTimer
from dsv4bench.core.ceilings import SameTrafficCopy
from dsv4bench.core.graphs import graph_replay
from kernels.gemm.config import choose_config
from kernels.gemm.family import gemm as ours
from kernels.gemm.glue import mn_major

out = open(os.path.join(os.environ.get("OUT", "/tmp"), "probe3.jsonl"), "w")
lib = ctypes.CDLL(os.path.join(os.path.dirname(__file__), "probe.so"))
timer = CudaTimer("cuda")
floor = SameTrafficCopy(timer, "cuda")
stream = lambda: ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
small = torch.zeros(65536 + 4096, dtype=torch.uint8, device="cuda")
P = lambda t: ctypes.c_void_p(t.data_ptr())

def tm(fn):
    rep, why = graph_replay(fn)
    assert rep is not None, why
    return round(timer.time(rep).median_ms * 1e3, 2)

LAY = [("flash.wkv", 512, 4096), ("flash.wq_a", 1024, 4096), ("pro.wkv", 512, 7168), ("pro.wq_a", 1536, 7168),
       ("flash.shared_w2", 4096, 2048), ("flash.indexer_wq_b", 8192, 1024), ("flash.wo_b", 4096, 8192),
       ("flash.shared_w13", 4096, 4096), ("pro.shared_w13", 6144, 7168), ("pro.wo_b", 7168, 16384)]
for name, n, k in LAY:
    m = 1
    kb, nb = k // 128, -(-n // 128)
    x = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
    sa = mn_major(torch.ones(m, kb, device="cuda")); sw = torch.ones(nb, kb, device="cuda")
    nbytes = m * k + 4 * m * kb + n * k + 4 * nb * kb + 2 * m * n
    fl = floor.ms(nbytes) * 1e3
    cfg = choose_config(m, n, k, sms=132)
    y = ours(x, sa, w, sw)
    rec = dict(layer=name, n=n, k=k, floor_us=round(fl, 2), rule=tm(lambda: ours(x, sa, w, sw, out=y)),
               cfg=dict(bn=cfg.bn, split=cfg.split_k, stages=cfg.n_stages), tma={})
    bn, ks = cfg.bn, cfg.split_k
    def put(key, fn):
        e = fn(); torch.cuda.synchronize()
        rec["tma"][key] = f"error {e}" if e else [tm(fn), None]
        if not e:
            rec["tma"][key][1] = round(100 * fl / rec["tma"][key][0], 1)
    for promo in (0, 2, 3):
        put(f"2d/p{promo}", lambda: lib.launch_tma2d(P(w), n, k, bn, 128, 16, 0, ks, P(small), promo, stream()))
    for kk in (1, 2, 4, 8):
        if (k // 128) // kk < ks:
            continue
        for promo in (2, 3):
            stages = max(2, 16 // kk) if bn == 32 else max(2, 8 // kk)
            put(f"3d/kk{kk}/s{stages}/p{promo}", lambda: lib.launch_tma3d(P(w), n, k, bn, kk, stages, ks, promo, stream()))
    put("bulk132", lambda: lib.launch_tma(P(w), ctypes.c_size_t(n * k), 132, stream()))
    out.write(json.dumps(rec) + "\n"); out.flush(); print(json.dumps(rec), flush=True)
