"""The embedding lookup into the hc streams (kernels/mhc/embed.py, the model's `embed` op): on a CPU,
its compile for sm_90a / sm_100a from fake tensors, the case space and the oracle of its inputs (edge
ids, negative ids, a table of 2^100 outside the named rows), and the served adapter with the kernel
emulated; on a GPU (marked `gpu`), the kernel and the served op against the oracle with fresh random
inputs, and an out-of-range id failing the launch rather than reading outside the table."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap

import pytest
import torch

from dsv4bench.core.case import Case
from dsv4bench.core.registry import SweepOptions, Unsupported, get_family, get_impl
from dsv4bench.model.dispatch import ORACLE_ONLY
from kernels.mhc import serves
from kernels.mhc.embed import EmbedKernel
from kernels.mhc.family import UNNAMED_ROW, embed_inputs
from oracles.mhc import embed_streams


def _case(t: int, d: int, v: int, ids: str = "random", dtype: str = "bf16") -> Case:
    return Case("mhc", {"op": "embed", "t": t, "d": d, "v": v, "ids": ids, "dtype": dtype})


def test_embed_is_served_and_off_the_oracle_only_list():
    assert "embed" in get_family("mhc").serves and "embed" not in ORACLE_ONLY


def test_the_space_has_flash_and_pro_decode_and_prefill_embeds():
    cases = [c for c in get_family("mhc").cases(SweepOptions(examples=8, seed=0)) if c["op"] == "embed"]
    assert {(c["t"], c["d"]) for c in cases if c["v"] == 129280} >= {(t, d) for t in (1, 32, 128, 4096)
                                                                     for d in (4096, 7168)}
    assert any(c["ids"] == "edges" for c in cases)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("d, dtype", [(4096, "bf16"), (7168, "bf16"), (4104, "fp32")])
def test_compiles_from_fake_tensors(arch, d, dtype):
    from dsv4bench.compile.artifacts import artifact, compiled_functions
    from dsv4bench.compile.cubin import parse_cubin

    impl, case = get_impl("mhc", "cutedsl"), _case(5, d, 1000, dtype=dtype)
    assert impl.supports(case, arch) is None
    for fn in compiled_functions(impl.compile(case, arch)):
        info = parse_cubin(artifact(fn))
        print(f"{info.registers} registers, {info.local_bytes} B local, {info.cubin_bytes} B cubin")
        assert info.local_bytes == 0 and 0 < info.registers <= 64


def test_rows_must_be_16_byte_vectors():
    with pytest.raises(ValueError):
        EmbedKernel(4100)
    assert get_impl("mhc", "cutedsl").supports(_case(1, 4100, 10), "sm_90a")


def test_edge_inputs_name_both_ends_and_negative_ids_and_the_oracle_reads_only_named_rows():
    gen = torch.Generator().manual_seed(random.randrange(1 << 30))
    case = _case(64, 16, 50, ids="edges")
    x = embed_inputs(case, gen, "cpu")
    ids, w = x["ids"], x["weight"]
    assert ids[:4].tolist() == [0, 49, -1, -50] and bool((ids < 0).sum() >= 2)
    named = torch.zeros(50, dtype=torch.bool)
    named[torch.where(ids < 0, ids + 50, ids)] = True
    assert bool((w[named].abs() < 100).all()) and bool((w[~named] == UNNAMED_ROW).all())
    fam = get_family("mhc")
    out = fam.oracle(case, x)["out"]
    assert out.shape == (64, 4, 16) and out.dtype == torch.float32 and bool(out.isfinite().all())
    assert torch.equal(out[:, 2], w[torch.where(ids < 0, ids + 50, ids)].float())
    assert torch.equal(fam.lowprec(case, x)["out"].float(), out)


def _emulated(params, inputs):
    """The kernel's contract in torch: what `run` returns for an embed case."""
    return {"out": embed_streams(inputs["ids"], inputs["weight"], 4)}


def test_served_adapter_keeps_the_ids_shape_and_the_table_dtype():
    w = torch.randn(100, 24).bfloat16()
    ids = torch.randint(-100, 100, (3, 5))
    out = serves.embed(_emulated, ids, w, 4)
    assert out.shape == (3, 5, 4, 24) and out.dtype == torch.bfloat16
    assert torch.equal(out, embed_streams(ids, w, 4))
    assert serves.embed(_emulated, ids[:0], w, 4).shape == (0, 5, 4, 24)


def test_served_adapter_refuses_what_the_kernel_does_not_take():
    w = torch.randn(10, 16)
    with pytest.raises(Unsupported):
        serves.embed(_emulated, torch.zeros(2, dtype=torch.long), w, 2)
    with pytest.raises(Unsupported):
        serves.embed(_emulated, torch.zeros(2, dtype=torch.long), w.half(), 4)


def test_the_served_op_refuses_cpu_tensors():
    from dsv4bench.model.kernel_ops import served_ops

    with pytest.raises(Unsupported):
        served_ops()["embed"](torch.zeros(2, dtype=torch.long), torch.randn(10, 16).bfloat16(), 4)


# ------------------------------------------------------------------------------------------- GPU

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("t, d, v, ids", [(1, 4096, 129280, "random"), (32, 7168, 129280, "edges"),
                                          (128, 4096, 129280, "random"), (4097, 7168, 129280, "random"),
                                          (33, 8, 1, "edges"), (257, 1032, 3001, "edges")])
def test_kernel_matches_the_oracle(t, d, v, ids, gpu_check):
    gpu_check(_case(t, d, v, ids))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("shape", [(1, 1), (32, 1), (128, 1), (2, 4096), (3, 1001)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_served_embed_matches_the_oracle(shape, dtype):
    from dsv4bench.model.kernel_ops import served_ops

    seed = random.randrange(1 << 30)
    print("seed", seed)
    gen = torch.Generator("cuda").manual_seed(seed)
    v, d = 129280, 4096
    w = torch.randn(v, d, generator=gen, device="cuda").to(dtype)
    ids = torch.randint(-v, v, shape, generator=gen, device="cuda")
    out = served_ops()["embed"](ids, w, 4)
    torch.cuda.synchronize()
    assert out.dtype == dtype and torch.equal(out, embed_streams(ids, w, 4))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("bad", [129280, -129281, 1 << 40])
def test_an_out_of_range_id_fails_the_launch(bad):
    """In a child process: the trap takes the CUDA context with it."""
    code = textwrap.dedent(f"""
        import torch
        from dsv4bench.model.kernel_ops import served_ops
        w = torch.randn(129280, 4096, device="cuda").bfloat16()
        ids = torch.tensor([5, {bad}, 7], device="cuda")
        try:
            out = served_ops()["embed"](ids, w, 4)
            torch.cuda.synchronize()
        except Exception as e:
            print("RAISED", type(e).__name__, e)
            raise SystemExit(3)
        print("NO ERROR", out.float().abs().sum().item())
    """)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300)
    print(proc.stdout[-2000:], proc.stderr[-2000:])
    assert proc.returncode != 0 and "NO ERROR" not in proc.stdout
