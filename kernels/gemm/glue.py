"""Our impl's glue: fake tensors for the CPU compile, argument checks, workspaces and the call."""

from __future__ import annotations


import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_tensor

from kernels.common import Prepared, argument_check, compile_kernel, sm_count
from kernels.gemm.gemm_sm90 import Fp8GemmSm90
from kernels.gemm.persistent_sm90 import tile_sum_rows
from kernels.gemm.tiling import KBLOCK, SCALE_BOX, STAMP_SLOTS, GemmConfig, straddles_groups
from sweeps.gemm import QUANT_GEMM


def groups_of(case) -> int:
    """A case's weight groups (1 but for the grouped wo_a)."""
    return case.params.get("groups", 1)


def quantises(case) -> bool:
    """Whether a case is the quant+gemm op (bf16 x, quantised inside the call), not the GEMM on
    pre-quantised operands (the cases without an `op`)."""
    return case.params.get("op") == QUANT_GEMM


def fake_args(cfg: GemmConfig) -> tuple:
    """x (M, G*K) fp8, sa (M, G*K/128) fp32 MN-major (x_box: its own row count), w (N, K) fp8, sw (N/128, K/128) fp32, y (M, N) bf16,
    the split-K workspace and counters, n_group, n_ctas; every size a runtime value."""
    m, n, ka, k, kba, kb, nb, ws, nt = (cute.sym_int32() for _ in range(9))
    fp8 = cutlass.Float8E4M3FN
    x = make_fake_tensor(fp8, (m, ka), (cute.sym_int64(divisibility=KBLOCK), 1), assumed_align=16)
    w = make_fake_tensor(fp8, (n, k), (cute.sym_int64(divisibility=KBLOCK), 1), assumed_align=16)
    # sa MN-major with 16-byte aligned columns, sw rows of whole TMA boxes (scales_for_tma)
    # x_box: sa comes as a view of max(4, x_box) rows over its padding rows (`sa_to_box`), not tied to M
    ma = cute.sym_int32() if cfg.x_box else m
    sa = make_fake_tensor(cutlass.Float32, (ma, kba), (1, cute.sym_int64(divisibility=4)), assumed_align=16)
    sw = make_fake_tensor(cutlass.Float32, (nb, kb), (cute.sym_int64(divisibility=SCALE_BOX), 1), assumed_align=16)
    y = make_fake_tensor(cutlass.BFloat16, (m, n), (cute.sym_int64(divisibility=8), 1), assumed_align=16)
    work = make_fake_tensor(cutlass.Float32, (ws,), (1,), assumed_align=16)
    count = make_fake_tensor(cutlass.Int32, (nt,), (1,), assumed_align=4)
    return x, sa, w, sw, y, work, count, cutlass.Int32(128), cutlass.Int32(132)


def compile_gemm(cfg: GemmConfig, arch: str = "sm_90a"):
    """Compile one tile configuration (no GPU needed)."""
    return compile_kernel(Fp8GemmSm90(cfg), *fake_args(cfg), arch=arch)


def check_operands(x, sa, w, sw, out=None, groups: int = 1) -> tuple[int, int, int]:
    """Validate the DSV4 FP8 operands (x [M, G*K], sa [M, G*K/128], w [N, K] with N = G*Ng, sw
    [ceil(N/128), K/128], out [M, N]); raise ValueError naming the offending tensor. Returns (M, N, K)."""
    need = argument_check("gemm")

    need(isinstance(groups, int) and groups >= 1, "groups", f"must be a positive integer, got {groups!r}")
    for name, t in (("x", x), ("w", w)):
        need(isinstance(t, torch.Tensor) and t.dim() == 2, name, "must be a 2-D tensor")
        need(t.dtype == torch.float8_e4m3fn, name, f"must be float8_e4m3fn, got {t.dtype}")
        need(t.is_contiguous(), name, f"must be contiguous (K-major), got strides {tuple(t.stride())}")
    m, ka = x.shape
    n, k = w.shape
    need(k % KBLOCK == 0 and k > 0, "w", f"K = {k} is not a positive multiple of {KBLOCK}")
    need(ka == groups * k, "x", f"has {ka} columns, expected groups x K = {groups} x {k}")
    need(n % 8 == 0 and n > 0, "w", f"N = {n} must be a positive multiple of 8 (16-byte output rows for TMA)")
    if groups > 1:
        need(n % (groups * KBLOCK) == 0, "w", f"N = {n} must be {groups} groups of a multiple of {KBLOCK} rows")
    need(m > 0, "x", "has M = 0")
    kb = k // KBLOCK
    for name, t, shape in (("sa", sa, (m, groups * kb)), ("sw", sw, ((n + KBLOCK - 1) // KBLOCK, kb))):
        need(isinstance(t, torch.Tensor) and t.dtype == torch.float32, name,
             f"must be a float32 tensor, got {getattr(t, 'dtype', type(t))}")
        need(tuple(t.shape) == shape, name, f"must have shape {shape}, got {tuple(t.shape)}")
        need(t.is_contiguous() or (name == "sa" and is_mn_major(t)), name,
             f"must be contiguous{' or MN-major (stride (1, ld), ld >= M)' if name == 'sa' else ''}, "
             f"got strides {tuple(t.stride())}")
    if out is not None:
        need(isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16, "out",
             f"must be bfloat16, got {getattr(out, 'dtype', type(out))}")
        need(tuple(out.shape) == (m, n), "out", f"must have shape {(m, n)}, got {tuple(out.shape)}")
        need(out.is_contiguous(), "out", "must be contiguous")
    devs = {t.device for t in (x, sa, w, sw) + ((out,) if out is not None else ())}
    need(len(devs) == 1, "x", f"and the other operands must be on one device, got {sorted(map(str, devs))}")
    return m, n, k



_WORK: dict = {}


def _indexed(device: torch.device) -> torch.device:
    """`cuda` as the current CUDA device's index, so a caller's `cuda` finds the kernel's `cuda:0` workspace."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def workspace(cfg: GemmConfig, m: int, n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Split-K fp32 tile sums and per-tile counters (zeroed once; the kernel leaves them at zero)."""
    tiles = -(-m // cfg.bm) * -(-n // cfg.bn)
    need_w = tiles * tile_sum_rows(cfg) * cfg.bn if cfg.split_k > 1 and not cfg.cluster_k else 4
    if cfg.stamps:  # the phase stamps: STAMP_SLOTS a CTA, one CTA an SM at most
        need_w = sm_count(device) * STAMP_SLOTS
    key = (str(_indexed(torch.device(device))),)  # "cuda" and "cuda:0" share one workspace
    work, count = _WORK.get(key, (None, None))
    if work is None or work.numel() < need_w:
        work = torch.zeros(max(need_w, 4), dtype=torch.float32, device=device)
    if count is None or count.numel() < max(tiles, 1):
        count = torch.zeros(max(tiles, 1024), dtype=torch.int32, device=device)
    _WORK[key] = (work, count)
    return work, count


def is_mn_major(sa: torch.Tensor) -> bool:
    """sa [M, cols] stored column by column (stride (1, ld), ld >= M)."""
    return sa.dim() == 2 and sa.stride(0) == 1 and (sa.shape[1] == 1 or sa.stride(1) >= sa.shape[0])


def mn_major_buffer(m: int, cols: int, device) -> torch.Tensor:
    """An uninitialised fp32 sa [m, cols] in the kernel's (and DeepGEMM's) layout: MN-major with
    ld = m rounded up to 4, so every column starts 16-byte aligned (a TMA box of one column). The
    quant+gemm op has the quant kernel write its scales straight into one (kernels/gemm/quant_gemm.py)."""
    ld = -(-m // 4) * 4
    return torch.empty(cols, ld, dtype=torch.float32, device=device).t()[:m]


def mn_major(sa: torch.Tensor) -> torch.Tensor:
    """sa [M, cols] in the `mn_major_buffer` layout: as is when it already is; else one small copy."""
    m, cols = sa.shape
    if is_mn_major(sa) and (cols == 1 or sa.stride(1) % 4 == 0) and sa.data_ptr() % 16 == 0:
        return sa
    buf = mn_major_buffer(m, cols, sa.device)
    buf.copy_(sa)
    return buf


_PADDED_SW = Prepared(size=64)  # weight scales padded to whole TMA boxes, per weight-scale tensor


def scales_for_tma(sa, sw, groups: int = 1, cfg: GemmConfig | None = None):
    """sa MN-major (`mn_major`; with `cfg.x_box`, seen as `cfg.sa_rows` rows: `sa_to_box`); sw in rows of whole
    TMA boxes of SCALE_BOX K blocks (16 bytes), 16-byte aligned: DSV4's K are (K/128 of 8 to 128); any other K
    gets a zero-padded copy of sw, made once per weight-scale tensor and version (two extra launches per call
    cost small GEMMs 2x)."""
    sa = mn_major(sa)
    if cfg is not None and cfg.x_box:
        sa = sa_to_box(sa, cfg.sa_rows)
    kb = sw.shape[1]
    if kb % SCALE_BOX == 0 and sw.data_ptr() % 16 == 0:
        return sa, sw

    def padded():
        sw_p = sw.new_zeros(sw.shape[0], -(-kb // SCALE_BOX) * SCALE_BOX)
        sw_p[:, :kb] = sw
        return sw_p

    return sa, _PADDED_SW.get((sw,), padded)


def run_gemm(compiled, cfg: GemmConfig, x, sa, w, sw, out, groups: int = 1, n_ctas: int | None = None):
    m, n = x.shape[0], w.shape[0]
    if m > cfg.bm and cfg.bm < 64:
        raise ValueError(f"gemm: {cfg} has a {cfg.bm}-row x tile, for M <= {cfg.bm} only (got M = {m})")
    if cfg.x_box and m > cfg.x_box:
        raise ValueError(f"gemm: {cfg} loads x in {cfg.x_box}-row boxes, for M <= {cfg.x_box} only (got M = {m})")
    check_pairs(cfg, n, groups)
    ctas = n_ctas or sm_count(x.device)
    check_cluster_round(cfg, m, n, ctas)
    sa, sw = scales_for_tma(sa, sw, groups, cfg)
    work, count = workspace(cfg, m, n, x.device)
    compiled(x, sa, w, sw, out, work, count, n // groups, ctas)
    return out


def sa_to_box(sa: torch.Tensor, rows: int) -> torch.Tensor:
    """sa [M, cols] (MN-major, ld = its column stride) seen as `rows` >= M rows where its storage holds them (rows
    <= ld: the padding rows of each column), so that no row of a `rows`-row TMA box lies past the tensor; else as is
    (TMA zero-fills the rows past M). The extra rows' scales reach only output rows that are never stored."""
    m, cols = sa.shape
    ld = sa.stride(1) if cols > 1 else rows
    need = sa.storage_offset() + (cols - 1) * ld + rows
    if rows <= m or rows > ld or sa.untyped_storage().nbytes() < need * sa.element_size():
        return sa
    return sa.as_strided((rows, cols), (1, ld))


def check_cluster_round(cfg: GemmConfig, m: int, n: int, ctas: int) -> None:
    """A split-K cluster merges once: every slice of every tile must be resident in one round."""
    units = -(-m // cfg.bm) * -(-n // cfg.bn) * cfg.split_k
    if cfg.cluster_k and units > ctas // cfg.split_k * cfg.split_k:
        raise ValueError(f"gemm: {cfg} needs {units} CTAs in one round (M {m}, N {n}), more than {ctas}")


def pairs_share_x(cfg: GemmConfig, n: int, groups: int = 1) -> bool:
    """A CTA pair (cluster_n 2) shares one x tile, so its two N tiles must lie in one weight group
    (grouped wo_a: the group width a multiple of the pair's 2 * bn columns)."""
    return cfg.cluster_n == 1 or groups == 1 or (n // groups) % (cfg.cluster_n * cfg.bn) == 0


def check_pairs(cfg: GemmConfig, n: int, groups: int) -> None:
    """A grouped GEMM's tiles (and CTA pairs) must each lie in one weight group."""
    if straddles_groups(cfg.bn, n, groups):
        raise ValueError(f"gemm: {cfg} puts N tiles across a group boundary (group width {n // groups})")
    if not pairs_share_x(cfg, n, groups):
        raise ValueError(f"gemm: {cfg} pairs N tiles across a group boundary (group width {n // groups})")


def draw_operands(m: int, n: int, k: int, seed: int, groups: int = 1):
    """Random DSV4-style operands on the CPU: activations x fp32 [m, groups*k] (rows of different
    magnitudes, so that the per-row scales matter) and W [n, k] (groups blocks of n/groups rows)
    quantised per 128x128 block: (x, e4m3 codes, fp32 ue8m0 scales)."""
    from oracles.quant import quant_fp8_weight, ue8m0_decode

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, groups * k, generator=gen) * torch.exp2(torch.randint(-3, 4, (m, 1), generator=gen).float())
    w = torch.randn(n, k, generator=gen) * 0.05 * torch.exp2(torch.randint(-2, 3, (n, 1), generator=gen).float())
    wq, sw = quant_fp8_weight(w)
    return x, wq, ue8m0_decode(sw).float().contiguous()


def make_operands(m: int, n: int, k: int, seed: int, device: str = "cpu", groups: int = 1):
    """The operands of `draw_operands` as the GEMM takes them: x quantised per (row, 128) with its
    scales MN-major (as serving stacks' quant kernels write them for DeepGEMM): (x, sa, w, sw)."""
    from oracles.quant import fp8_block_quant

    x, wq, sw = draw_operands(m, n, k, seed, groups)
    xq, sa = fp8_block_quant(x, KBLOCK)
    return xq.to(device), mn_major(sa.float().to(device)), wq.to(device), sw.to(device)


def oracle_of(x, sa, w, sw, groups: int = 1) -> torch.Tensor:
    """FP32 truth: dequant(x) . blockdiag(dequant(W))^T (oracles/linear.py)."""
    from oracles.linear import grouped_linear

    xd, wd = dequant_operands(x, sa, w, sw)
    return grouped_linear(xd, wd, groups)


def dequant_operands(x, sa, w, sw, **_):
    """fp32 dequant(x) [M, G*K] and dequant(W) [N, K]."""
    from oracles.quant import dequant_fp8_weight, fp8_block_dequant

    return fp8_block_dequant(x, sa, KBLOCK), dequant_fp8_weight(w, sw)
