"""Every declared knock-out variant of the fmha kernel (kernels/fmha/variants.py) is registered as an
unchecked `cutedsl:<variant>`, compiles for sm_90a from fake tensors (no GPU) on each of the
kernel's schedules, and generates different code from the shipped kernel: a knock-out that knocks
out nothing (the probe's no-gather on TMA-loaded tiles did) would time the shipped kernel twice.
On a GPU each runs once through the evaluation path: it must return and keep its stores in bounds."""

import functools
import re

import pytest

from dsv4bench.compile.sass import find_nvdisasm, sass_of
from dsv4bench.core.case import Case
from dsv4bench.core.registry import get_impl, impls
from kernels.fmha import variants
from kernels.fmha.glue import config_for
from sweeps import fmha as space

KNOCK_OUTS = [cls.name for cls in variants.VARIANTS]


def _case(**want) -> Case:
    params = next(p for p in space.production() if all(p[k] == v for k, v in want.items()))
    return Case("fmha", params)


CASES = {  # one per schedule and load path
    "pingpong-tma": _case(mask="none", hd=128),
    "pingpong-persistent": _case(mask="causal", hd=128),
    "key-split-gather": _case(mask="sparse", hd=512, h_q=64, kv_layout="shared"),
    "split-d-tma": _case(mask="none", hd=512, kv_shared=False),
}


@functools.cache
def _sass(impl_name: str, case_name: str) -> str | None:
    compiled = get_impl("fmha", impl_name).compile(CASES[case_name], "sm_90a")
    text = sass_of(compiled)
    return None if text is None else re.sub(r"kernel_cutlass_kernel_\w+", "KERNEL", text)


def test_variants_are_declared_unchecked_and_not_run_by_default():
    plain = {i.name for i in impls("fmha")}
    declared = {i.name: i for i in impls("fmha", variants=True) if i.variant}
    decode = {cls.name for cls in variants.DECODE_VARIANTS}  # the FP8 decode's
    prefill = {cls.name for cls in variants.PREFILL_VARIANTS}  # checked A/B forms of the prefill (tests/fmha/test_fmha_v11.py)
    assert prefill <= set(declared) and all(n not in plain and declared[n].checked for n in prefill)
    decode |= prefill
    assert decode <= set(declared) and all(n not in plain for n in decode)
    exact = {"cutedsl:decode-no-prefetch"}  # knocks out a hint only: the answer stands, checked
    assert all(declared[n].checked != ("no-" in n and n not in exact) for n in decode)
    declared = {n: i for n, i in declared.items() if n not in decode}
    assert set(KNOCK_OUTS) == set(declared)
    for name, impl in declared.items():
        assert name == f"cutedsl:{impl.variant}" and not impl.checked and name not in plain


def test_cases_cover_every_schedule():
    cfgs = {k: config_for(c) for k, c in CASES.items()}
    assert cfgs["pingpong-tma"].tma_kv and not cfgs["pingpong-tma"].persistent
    assert cfgs["pingpong-persistent"].persistent
    assert cfgs["key-split-gather"].key_split and cfgs["key-split-gather"].per_token_idx
    assert cfgs["split-d-tma"].n_dsplit == 2 and not cfgs["split-d-tma"].key_split


@pytest.mark.parametrize("case_name", list(CASES))
@pytest.mark.parametrize("variant", KNOCK_OUTS)
def test_variant_compiles_and_knocks_something_out(variant, case_name):
    assert get_impl("fmha", variant).supports(CASES[case_name], "sm_90a") is None
    mine = _sass(variant, case_name)  # compiles (FAIL here is a compile error)
    if find_nvdisasm() is None:
        pytest.skip("no nvdisasm: compiled, SASS not compared")
    assert mine != _sass("cutedsl", case_name), f"{variant} generates the shipped kernel's code on {case_name}"


@pytest.mark.gpu
@pytest.mark.parametrize("case_name", list(CASES))
@pytest.mark.parametrize("variant", KNOCK_OUTS)
def test_variant_runs_on_the_gpu(variant, case_name, gpu_check):
    """Through the one evaluation path: the knock-out still balances its barriers (it returns),
    stores nothing past its outputs, leaves its inputs unchanged; its output is not compared."""
    outcome = gpu_check(CASES[case_name], get_impl("fmha", variant))
    assert outcome.status == "UNCHECKED", outcome.reason
