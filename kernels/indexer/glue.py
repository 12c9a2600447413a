"""Our impl's glue: fake tensors for the CPU compile, argument checks, the per-query key ranges, the
inputs of a case (logits and top-k), the thin FP8-cache oracle over oracles/indexer.py, and the call."""

from __future__ import annotations


import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_tensor

from kernels.common import argument_check, compile_kernel, sm_count
from kernels.indexer.logits_sm90 import HEAD_DIM, HEADS, IndexerLogitsSm90, LogitsConfig

CSA_RATIO = 4  # one compressed indexer entry per 4 tokens (spec §5, §6)
ORACLE_CHUNK_BYTES = 1 << 28  # the fp32 [rows, 64, S_kv] intermediate of one oracle chunk


def fake_args(cfg: LogitsConfig) -> tuple:
    """q (T*64, 128) fp8, kv (S_kv, 128) fp8 (row stride a multiple of 16 B), sc (S_kv,) fp32, w (T, 64)
    fp32, ks / ke (T,) int32, logits (T, S_kv) fp32 (any row stride), n_split, n_ctas; every size a
    runtime value (T and S_kv shared, so the TVM-FFI call checks that they agree)."""
    t, s_kv, tq = cute.sym_int32(), cute.sym_int32(), cute.sym_int32()
    fp8 = cutlass.Float8E4M3FN
    q = make_fake_tensor(fp8, (tq, HEAD_DIM), (HEAD_DIM, 1), assumed_align=16)
    kv = make_fake_tensor(fp8, (s_kv, HEAD_DIM), (cute.sym_int64(divisibility=16), 1), assumed_align=16)
    sc = make_fake_tensor(cutlass.Float32, (s_kv,), (1,), assumed_align=16)
    w = make_fake_tensor(cutlass.Float32, (t, HEADS), (HEADS, 1), assumed_align=16)
    ks = make_fake_tensor(cutlass.Int32, (t,), (1,), assumed_align=4)
    ke = make_fake_tensor(cutlass.Int32, (t,), (1,), assumed_align=4)
    out = make_fake_tensor(cutlass.Float32, (t, s_kv), (cute.sym_int64(), 1), assumed_align=4)
    return q, kv, sc, w, ks, ke, out, cutlass.Int32(1), cutlass.Int32(132)


def compile_logits(cfg: LogitsConfig, arch: str = "sm_90a"):
    """Compile one configuration (no GPU needed)."""
    return compile_kernel(IndexerLogitsSm90(cfg), *fake_args(cfg), arch=arch)


def check_operands(q, kv, sc, w, ks, ke, out=None) -> tuple[int, int]:
    """Validate DeepGEMM's fp8_mqa_logits operands (q [T, 64, 128] e4m3, kv [S_kv, 128] e4m3, sc [S_kv]
    fp32, w [T, 64] fp32, ks / ke [T] int32, out [T, S_kv] fp32); raise ValueError naming the
    offending tensor. Returns (T, S_kv). Values are not checked (that would cost a device sync):
    ks / ke are clamped to [0, S_kv] by the kernel, and sc must be >= 0."""
    need = argument_check("indexer")

    def dtype_of(t):
        return getattr(t, "dtype", type(t).__name__)

    for name, t, dim in (("q", q, 3), ("kv", kv, 2), ("sc", sc, 1), ("w", w, 2), ("ks", ks, 1), ("ke", ke, 1)):
        need(isinstance(t, torch.Tensor), name, f"must be a tensor, got {type(t).__name__}")
        need(t.dim() == dim, name, f"must be {dim}-D, got shape {tuple(t.shape)}")
    for name, t in (("q", q), ("kv", kv)):
        need(t.dtype == torch.float8_e4m3fn, name, f"must be float8_e4m3fn, got {t.dtype}")
    for name, t in (("sc", sc), ("w", w)):
        need(t.dtype == torch.float32, name, f"must be float32, got {dtype_of(t)}")
    for name, t in (("ks", ks), ("ke", ke)):
        need(t.dtype == torch.int32, name, f"must be int32, got {dtype_of(t)}")
    n_tok, s_kv = q.shape[0], kv.shape[0]
    need(tuple(q.shape[1:]) == (HEADS, HEAD_DIM), "q", f"must be [T, {HEADS}, {HEAD_DIM}], got {tuple(q.shape)}")
    need(q.is_contiguous(), "q", f"must be contiguous, got strides {tuple(q.stride())}")
    need(kv.shape[1] == HEAD_DIM, "kv", f"must be [S_kv, {HEAD_DIM}], got {tuple(kv.shape)}")
    need(kv.stride(1) == 1 and kv.stride(0) % 16 == 0 and kv.data_ptr() % 16 == 0, "kv",
         f"rows must be contiguous, 16-byte aligned (TMA), got strides {tuple(kv.stride())}")
    need(tuple(sc.shape) == (s_kv,), "sc", f"must have shape ({s_kv},) (one scale per key), got {tuple(sc.shape)}")
    need(sc.is_contiguous() and sc.data_ptr() % 16 == 0, "sc", "must be contiguous and 16-byte aligned (TMA)")
    need(tuple(w.shape) == (n_tok, HEADS), "w", f"must have shape {(n_tok, HEADS)}, got {tuple(w.shape)}")
    need(w.is_contiguous(), "w", f"must be contiguous, got strides {tuple(w.stride())}")
    for name, t in (("ks", ks), ("ke", ke)):
        need(tuple(t.shape) == (n_tok,), name, f"must have shape ({n_tok},) (one per query), got {tuple(t.shape)}")
        need(t.is_contiguous(), name, "must be contiguous")
    if out is not None:
        need(isinstance(out, torch.Tensor) and out.dtype == torch.float32, "out",
             f"must be float32, got {dtype_of(out)}")
        need(tuple(out.shape) == (n_tok, s_kv), "out", f"must have shape {(n_tok, s_kv)}, got {tuple(out.shape)}")
        need(out.stride(1) == 1 or s_kv <= 1, "out", f"rows must be contiguous, got strides {tuple(out.stride())}")
    devs = {t.device for t in (q, kv, sc, w, ks, ke) + ((out,) if out is not None else ())}
    need(len(devs) == 1, "q", f"and the other operands must be on one device, got {sorted(map(str, devs))}")
    return n_tok, s_kv


# ---------------- per-query key ranges (DeepGEMM's ks / ke) ----------------

def causal_ranges(n_tok: int, s_kv: int, p0: int = 0, device="cpu", m: int = CSA_RATIO):
    """Queries at positions p0 .. p0+T-1 see entries [0, min(floor((p+1)/m), S_kv)) (spec §5.6)."""
    pos = torch.arange(p0, p0 + n_tok, device=device)
    ke = ((pos + 1) // m).clamp(max=s_kv)
    return torch.zeros(n_tok, dtype=torch.int32, device=device), ke.to(torch.int32)


def varlen_ranges(lens, device="cpu", m: int = CSA_RATIO):
    """Sequences packed along T (each a prefill from position 0) with their entries packed along
    S_kv: query i of sequence b sees [off_b, off_b + floor((i+1)/m)). Returns (ks, ke, S_kv)."""
    ks, ke, off = [], [], 0
    for n in lens:
        ks.append(torch.full((n,), off, dtype=torch.int32))
        ke.append(off + (torch.arange(n, dtype=torch.int32) + 1) // m)
        off += n // m
    return torch.cat(ks).to(device), torch.cat(ke).to(device), off


# ---------------- inputs and the oracle ----------------

def make_inputs(n_tok: int, s_kv: int, ks: torch.Tensor, ke: torch.Tensor, seed: int, device="cpu",
                ties: bool = False) -> dict:
    """DSV4-like indexer operands. q: the reference's query values (Hadamard-rotated, FP4-simulated
    with power-of-two block scales), which e4m3 holds exactly; keys: random rows of varied magnitude
    quantised per key to e4m3 with an fp32 scale amax/448 (the FP8 indexer cache); w: the per-head
    weights with the 128^-0.5 * 64^-0.5 scale. ties: every key the same (all-equal logits per row)."""
    from oracles.hadamard import hadamard_rotate
    from oracles.indexer import head_weight_scale
    from oracles.quant import fp4_qdq, fp8_block_quant

    gen = torch.Generator().manual_seed(seed)
    q = fp4_qdq(hadamard_rotate(torch.randn(n_tok, HEADS, HEAD_DIM, generator=gen)), 32)
    if ties:
        k = torch.randn(1, HEAD_DIM, generator=gen).expand(s_kv, HEAD_DIM).contiguous()
    else:
        mag = torch.exp2(torch.randint(-3, 3, (s_kv, 1), generator=gen).float())  # keys of varied norms
        k = torch.randn(s_kv, HEAD_DIM, generator=gen) * mag
    kq, sc = fp8_block_quant(k, HEAD_DIM, scale_fmt=None)
    w = torch.randn(n_tok, HEADS, generator=gen) * head_weight_scale(HEADS, HEAD_DIM)
    return {"q": q.to(torch.float8_e4m3fn).to(device), "kv": kq.to(device),
            "sc": sc.reshape(s_kv).float().contiguous().to(device), "w": w.to(device),
            "ks": ks.to(torch.int32).to(device), "ke": ke.to(torch.int32).to(device)}


def topk_logits(ks: torch.Tensor, ke: torch.Tensor, s_kv: int, values: str, gen: torch.Generator) -> torch.Tensor:
    """Top-k inputs: fp32 logits [T, S_kv], -inf outside ks <= s < ke. values: randn, bf16 (randn
    rounded to bf16: heavy ties at the threshold) or equal (one value per row: every valid entry ties)."""
    n_tok = ks.numel()
    if values == "equal":
        x = torch.randn(n_tok, 1, generator=gen).expand(n_tok, s_kv).contiguous()
    elif values in ("randn", "bf16"):
        x = torch.randn(n_tok, s_kv, generator=gen)
        x = x.bfloat16().float() if values == "bf16" else x
    else:
        raise ValueError(f"indexer top-k: values must be randn, bf16 or equal, got {values!r}")
    return x.masked_fill_(~range_mask(ks, ke, s_kv), float("-inf"))


def range_mask(ks: torch.Tensor, ke: torch.Tensor, s_kv: int) -> torch.Tensor:
    """[T, S_kv] True where ks[t] <= s < ke[t]."""
    ar = torch.arange(s_kv, device=ks.device)
    return (ar >= ks.long().unsqueeze(-1)) & (ar < ke.long().unsqueeze(-1))


def _chunks(n_tok: int, s_kv: int, per_elem: int):
    rows = max(1, ORACLE_CHUNK_BYTES // max(1, HEADS * s_kv * per_elem))
    return [(i, min(i + rows, n_tok)) for i in range(0, n_tok, rows)]


def _scores(fn, q, k, w, ks, ke, per_elem: int) -> torch.Tensor:
    """fn (oracles/indexer.py indexer_scores or its _lowprec twin) over row chunks with every key
    visible, then the ks / ke ranges as the mask."""
    n_tok, s_kv = q.shape[0], k.shape[0]
    out = torch.empty(n_tok, s_kv, dtype=torch.float32, device=q.device)
    all_visible = torch.full((1,), CSA_RATIO * s_kv, device=q.device)  # floor((p+1)/4) >= S_kv
    for a, b in _chunks(n_tok, s_kv, per_elem):
        out[a:b] = fn(q[None, a:b], k[None], w[None, a:b], all_visible.expand(b - a))[0].float()
    return out.masked_fill_(~range_mask(ks, ke, s_kv), float("-inf"))


def oracle_of(q, kv, sc, w, ks, ke) -> torch.Tensor:
    """FP32 truth of the FP8-cache form: oracles.indexer.indexer_scores on the dequantised keys
    kv * sc (so ReLU(q . k * sc), the spec's form), masked to ks <= s < ke."""
    from oracles.indexer import indexer_scores

    return _scores(indexer_scores, q.float(), kv.float() * sc.unsqueeze(-1), w.float(), ks, ke, 4)


def lowprec_of(q, kv, sc, w, ks, ke) -> torch.Tensor:
    """The reference's bf16 path (oracles.indexer.indexer_scores_lowprec) on the same values: q in
    bf16 (exact from e4m3), keys dequantised to bf16, bf16 weights."""
    from oracles.indexer import indexer_scores_lowprec

    k = (kv.float() * sc.unsqueeze(-1)).bfloat16()
    return _scores(indexer_scores_lowprec, q.bfloat16(), k, w.bfloat16(), ks, ke, 2)


# ---------------- the call ----------------


def run_logits(compiled, cfg: LogitsConfig, q, kv, sc, w, ks, ke, out, n_split: int | None = None,
               n_ctas: int | None = None):
    """out[T, S_kv] <- the logits (every element written; -inf outside ks <= s < ke)."""
    from kernels.indexer.config import choose_split

    n_tok, s_kv = q.shape[0], kv.shape[0]
    if n_tok == 0 or s_kv == 0:
        return out
    sms = n_ctas or sm_count(q.device)
    split = n_split or choose_split(n_tok, s_kv, cfg, sms)
    compiled(q.view(n_tok * HEADS, HEAD_DIM), kv, sc, w, ks, ke, out, split, sms)
    return out
