"""v12, the default sparse prefill (kernels/fmha/prefill_v11.py; `cutedsl`: v11 with O stored a 64-column tile at a
time), v11 (`cutedsl:v11`) and its A/B forms (v10 with one of its changes: `cutedsl:q-first`, `epi-tma`, `gather-hint`) compile for sm_90a from fake tensors (no GPU) at the Flash (h_q 64) and Pro (h_q 128)
shapes without spills, and their SASS shows the change each claims against v10's (GatherAttentionSm90, `cutedsl:v10`): Q by
TMA and 32 fewer cp.async a producer thread; O by stmatrix + TMA store with no scalar bf16 stores and
one CTA-wide barrier fewer; the K rows' cp.async with a cache-policy descriptor, zero-fill predicates and
immediate offsets. Elsewhere (other schedules) each compiles v10's code. The addressing formula of
gather-hint is checked against CuTe's layout of the K stages. GPU correctness: tests/fmha/test_fmha_gpu.py
(`test_cutedsl_matches_fp32_oracle`, `test_prefill_forms_match_fp32_oracle`)."""

import collections
import functools
import re

import cutlass
import cutlass.cute as cute
import pytest

from dsv4bench.compile.cubin import parse_cubin
from dsv4bench.compile.sass import find_nvdisasm, sass_of
from dsv4bench.core.registry import get_impl, impls
from kernels.fmha import prefill_v11, variants
from kernels.fmha.compiling import compile_config
from kernels.fmha.config import Config
from kernels.fmha.kernel_sm90 import GatherAttentionSm90

NAMES = {"cutedsl:q-first": prefill_v11.QFirst, "cutedsl:epi-tma": prefill_v11.EpiTma,
         "cutedsl:gather-hint": prefill_v11.GatherHint, "cutedsl:v11": prefill_v11.V11, "cutedsl": prefill_v11.V12}
SHAPES = {"flash": 64, "pro": 128, "pro-tp8": 16, "flash-tp8": 8}  # query heads per kv head (h_kv = 1); TP 8 splits


def _cfg(hpg: int) -> Config:
    return Config(d=512, dv=512, hpg=hpg, kv_shared=True, per_token_idx=True)


@functools.cache
def _compiled(cls, cfg: Config):
    return compile_config(cfg, "sm_90a", cls)


@functools.cache
def _ops(cls, cfg: Config) -> tuple[collections.Counter, str]:
    text = sass_of(_compiled(cls, cfg))
    ops = collections.Counter()
    for line in text.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if m:
            ops[m.group(2)] += 1
    return ops, text


def _sass(cls, cfg: Config) -> str:
    """The SASS with the kernel's mangled name masked: two classes compiling the same code compare equal."""
    return re.sub(r"kernel_cutlass_kernel_\w+", "KERNEL", _ops(cls, cfg)[1])


def _count(ops: collections.Counter, op: str) -> int:
    return sum(n for name, n in ops.items() if name == op or name.startswith(op + "."))


def test_v12_is_the_default_and_the_forms_are_checked_variants():
    plain = {i.name for i in impls("fmha")}
    declared = {i.name: i for i in impls("fmha", variants=True)}
    assert [cls.name for cls in variants.PREFILL_VARIANTS] == ["cutedsl:v10", *list(NAMES)[:3], "cutedsl:spin-wait",
                                                                    "cutedsl:v11"]
    assert declared["cutedsl:spin-wait"].kernel_class is prefill_v11.SpinWait
    assert declared["cutedsl:v10"].kernel_class is GatherAttentionSm90
    for name, cls in NAMES.items():
        impl = get_impl("fmha", name) if name == "cutedsl" else declared[name]
        assert impl.checked and (name in plain) == (name == "cutedsl") and impl.kernel_class is cls


def test_gather_addressing_matches_the_k_stage_layout():
    """GatherHint's one-base-plus-immediates addressing (`swizzled_k_offset`) against CuTe: the K stages'
    layout is SW128 (Swizzle<3,4,3> on byte addresses, 1024-aligned region) over an outer layout whose
    unswizzled byte offset is 2 x crd2idx; every 16-byte chunk of every row of both stages must agree."""
    got = {}

    @cute.jit
    def probe():
        _, sK, _, _ = GatherAttentionSm90(_cfg(64)).smem_layouts(cutlass.BFloat16)
        got["swizzle"] = str(sK.inner)
        for stage in cutlass.range_constexpr(2):
            for row in cutlass.range_constexpr(64):
                for ch in cutlass.range_constexpr(64):
                    got[stage, row, ch] = cute.crd2idx((row, ch * 8, stage), sK.outer)

    cute.compile(probe)
    assert got.pop("swizzle") == "S<3,4,3>"
    bad = []
    for (stage, row, ch), idx in got.items():
        plain = 2 * int(idx)
        phys = plain ^ ((plain >> 3) & 0x70)  # SW128: 16-byte chunk bits [4,7) ^= 128-byte row bits [7,10)
        if phys != stage * 64 * 1024 + prefill_v11.swizzled_k_offset(row, ch, 512):
            bad.append((stage, row, ch))
    assert len(got) == 2 * 64 * 64 and not bad, bad[:8]


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("name", list(NAMES))
def test_candidate_compiles_without_spills(name, shape):
    compiled = _compiled(NAMES[name], _cfg(SHAPES[shape]))  # FAIL here is a compile error
    info = parse_cubin(compiled.__cubin__)
    assert info.cubin_bytes > 0
    assert not info.local_bytes, f"{name} at {shape}: {info.local_bytes} B of local memory"


needs_sass = pytest.mark.skipif(find_nvdisasm() is None, reason="no nvdisasm: SASS not checked")


@needs_sass
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("name", list(NAMES))
def test_candidate_sass_shows_its_change(name, shape):
    cfg = _cfg(SHAPES[shape])
    base, _ = _ops(GatherAttentionSm90, cfg)
    mine, text = _ops(NAMES[name], cfg)
    whole = ("cutedsl:v11", "cutedsl")
    q_tma = name in ("cutedsl:q-first", *whole)
    o_tma = name in ("cutedsl:epi-tma", *whole)
    hint = name in ("cutedsl:gather-hint", *whole)
    # Q: 8 TMA boxes (64 heads x 64 d) instead of 32 cp.async a producer thread
    assert _count(mine, "UTMALDG") == (8 if q_tma else 0)
    assert _count(mine, "LDGSTS.E") == _count(base, "LDGSTS.E") - (32 if q_tma else 0)
    # O: 4 TMA boxes a warpgroup from 16 stmatrix.x4 a thread; no scalar bf16 stores, no 16-byte
    # shared loads / global stores, one CTA-wide named barrier fewer
    assert _count(mine, "UTMASTG") == (4 if o_tma else 0)
    if o_tma:
        assert _count(mine, "STS.U16") == 0 and _count(base, "STS.U16") == 128
        assert _count(mine, "STSM") == _count(base, "STSM") + 16
        assert _count(mine, "LDS.128") == 0 and _count(mine, "STG.E.128") == 0
        # v12 (`cutedsl`) meets its warpgroup's barrier once a 64-column store tile: 3 more
        assert _count(mine, "BAR.SYNC") == _count(base, "BAR.SYNC") - 1 + (3 if name == "cutedsl" else 0)
    else:
        assert _count(mine, "STS.U16") == _count(base, "STS.U16")
    # K rows: a cache-policy descriptor, zero-fill predicates, immediate smem / gmem offsets
    hinted = [line for line in text.splitlines()
              if re.search(r"LDGSTS\.E\S* \[R\d+\+0x[0-9a-f]+\], desc\[UR\d+\]\[R\d+\.64\+0x[0-9a-f]+\], !?P\d", line)]
    assert (len(hinted) >= 64) == hint, len(hinted)


@needs_sass
@pytest.mark.parametrize("name", list(NAMES))
def test_candidate_is_the_shipped_code_elsewhere(name):
    """A configuration none of v11's changes applies to (dense hd 128): v10's SASS."""
    cfg = Config(d=128, dv=128, hpg=1, kv_shared=False, per_token_idx=False)
    assert _sass(NAMES[name], cfg) == _sass(GatherAttentionSm90, cfg)


@needs_sass
@pytest.mark.parametrize("shape", list(SHAPES))
def test_v12_stores_o_a_tile_at_a_time(shape):
    """Against v11's SASS: v12 stores O's 4 boxes a warpgroup each behind its own barrier (3 bar.sync more, the same
    16 stmatrix.x4 a thread) and keeps the wait for the TMA store's reads before the CTA exits."""
    cfg = _cfg(SHAPES[shape])
    base, base_text = _ops(prefill_v11.V11, cfg)
    ops, text = _ops(prefill_v11.V12, cfg)
    assert _count(ops, "UTMASTG") == _count(base, "UTMASTG") == 4
    assert _count(ops, "STSM") == _count(base, "STSM")
    assert _count(ops, "BAR.SYNC") == _count(base, "BAR.SYNC") + 3
    assert text.count("DEPBAR.LE SB0") == base_text.count("DEPBAR.LE SB0") >= 1


@needs_sass
@pytest.mark.parametrize("hpg", [1, 3, 12, 32, 48, 20, 24, 40])
def test_tp_split_heads_take_the_forms_where_their_o_box_compiles(hpg):
    """Below 64 heads a group, v12 stores O in boxes of hpg rows: at hpg <= 16 or a multiple of 16 (its Q / O boxes
    in the SASS, no spills); at 20, 24 or 40 such a box aborted the compiler, so those compile v10's code."""
    cfg = _cfg(hpg)
    ops, _ = _ops(prefill_v11.V12, cfg)
    if hpg <= 16 or hpg % 16 == 0:
        assert _count(ops, "UTMALDG") == 8 and _count(ops, "UTMASTG") == 4
        assert not parse_cubin(_compiled(prefill_v11.V12, cfg).__cubin__).local_bytes
    else:
        assert _sass(prefill_v11.V12, cfg) == _sass(GatherAttentionSm90, cfg)
