"""The compressor's decode-time kernels (kernels/compressor_decode/) and the model ops they serve,
`compressor_push` and `compressor_post`. On a CPU: the case space, the compile of every decode kernel for
sm_90a / sm_100a from fake tensors, the oracle glue (a prefill pushed token by token gives the prefill's
entries), the adapters with the kernels emulated in torch, what they refuse. On a GPU (marked `gpu`):
every production case and draws through the harness's evaluation, whole decode runs of CSA / HCA /
indexer compressors token by token (block completions at many positions, ragged batches) against the
oracle's state and entries, and the served ops against their FP32 oracles with fresh random inputs."""

from __future__ import annotations

import random

import pytest
import torch

from dsv4bench.compile.artifacts import artifact, compiled_functions
from dsv4bench.compile.cubin import parse_cubin
from dsv4bench.core.case import Case
from dsv4bench.core.compare import compare_outputs
from dsv4bench.core.registry import SweepOptions, Unsupported, get_family, get_impl
from dsv4bench.model.dispatch import ORACLE_ONLY
from kernels.compressor.family import split
from kernels.compressor_decode import serves
from kernels.compressor_decode.decode import PostKernel, PushKernel
from kernels.compressor_decode.family import push_eager
from oracles.compressor import (
    CompressorState,
    block_candidates,
    compressor_project,
    overlaps,
    pool,
    postprocess,
    postprocess_lowprec,
)
from oracles.norm import NORM_EPS
from oracles.rope import COMPRESSED_ROPE, rope_freqs

COMPRESSORS = ((4, 512, False), (128, 512, False), (4, 128, True))  # CSA, HCA, the indexer's


def _seed() -> int:
    seed = random.randrange(1 << 30)
    print("seed", seed)
    return seed


def _decode_cases(**kw):
    return get_family("compressor_decode").cases(SweepOptions(**kw))


def test_the_decode_ops_are_served_and_off_the_oracle_only_list():
    served = get_family("compressor_decode").serves
    for op in ("compressor_push", "compressor_post"):
        assert op in served and op not in ORACLE_ONLY


def test_the_space_covers_batches_compressors_and_block_boundaries():
    cases = _decode_cases(examples=0)
    push = {(c["m"], c["d"], c["b"], c["t"]) for c in cases if c["op"] == "push"}
    for m, d, _ in COMPRESSORS:
        for b in (1, 32, 128):
            assert {(m, d, b, t) for t in (m - 1, m, 1000 * m + m - 1)} <= push
            assert any(k[:3] == (m, d, b) and (k[3] + 1) % m for k in push), "a token that completes no block"
    post = {(c["m"], c["d"], c["indexer"], c["b"]) for c in cases if c["op"] == "post"}
    assert {(m, d, ix, b) for m, d, ix in COMPRESSORS for b in (1, 32, 128)} <= post
    assert _decode_cases(examples=6, seed=3, grid=False), "no decode draws"


@pytest.mark.parametrize("kw", [dict(m=4, d=512, groups=2), dict(m=128, d=512, groups=3), dict(m=4, d=96)])
def test_push_rejects_bad_shapes(kw):
    with pytest.raises(ValueError):
        PushKernel(**kw)


def test_the_indexer_post_needs_d_128():
    with pytest.raises(ValueError):
        PostKernel(512, NORM_EPS, indexer=True)


def _compile_cases():
    impl, seen = get_impl("compressor_decode", "cutedsl"), {}
    for c in _decode_cases(examples=0):
        seen.setdefault(impl.compile_key(c, "sm_90a"), c)
    return list(seen.values())


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("case", _compile_cases(), ids=lambda c: c.shape_str())
def test_decode_kernels_compile_from_fake_tensors(case, arch):
    impl = get_impl("compressor_decode", "cutedsl")
    assert impl.supports(case, arch) is None
    for fn in compiled_functions(impl.compile(case, arch)):
        info = parse_cubin(artifact(fn))
        print(case, f"{info.registers} registers, {info.local_bytes} B local")
        assert info.local_bytes == 0 and 0 < info.registers <= 128


@pytest.mark.parametrize("m, d, _ix", COMPRESSORS)
def test_pushing_a_prefill_token_by_token_gives_its_entries(m, d, _ix):
    """The oracle glue of the push cases (push_eager): from the state after a prefill of p tokens,
    pushing the rest one at a time emits exactly the entries the whole prefill pools."""
    gen = torch.Generator().manual_seed(_seed())
    b, s, p = 2, 3 * m + 1, m + 1
    w = d * (2 if overlaps(m) else 1)
    kv, score = torch.randn(b, s, w, generator=gen), 2 * torch.randn(b, s, w, generator=gen)
    whole = pool(*block_candidates(kv, score, m))
    state = CompressorState.after_prefill(kv[:, :p], score[:, :p], m)
    got = []
    for t in range(p, s):
        out = push_eager(state.kv, state.score, kv[:, t], score[:, t], m, t)
        state.kv, state.score = out["kv"], out["score"]
        assert ("entry" in out) == ((t + 1) % m == 0)
        if "entry" in out:
            got.append(out["entry"])
    assert torch.allclose(torch.stack(got, 1), whole[:, p // m:], atol=1e-6)


# --- the adapters, the kernels emulated in torch ----------------------------------------------------


def _rope_by_table(x, table):
    """RoPE of the last 64 dims by the (cos, sin) table rows: the kernel's contract on its table."""
    cs = table.unflatten(-1, (-1, 2))
    a, b = x[..., -64::2], x[..., -63::2]
    out = x.clone()
    out[..., -64::2], out[..., -63::2] = a * cs[..., 0] - b * cs[..., 1], a * cs[..., 1] + b * cs[..., 0]
    return out


class _Emulated:
    """`run` of a KernelOp whose compiled kernels are torch emulations of the decode kernels."""

    def __init__(self):
        self.params = []

    def compiled(self, params, inputs):
        self.params.append(params)
        if params["op"] == "push":
            def push(kv, score, kv_t, score_t, entry, t):
                out = push_eager(kv, score, kv_t, score_t, params["m"], t)
                kv.copy_(out["kv"])
                score.copy_(out["score"])
                if "entry" in out:
                    entry.copy_(out["entry"])
            return push

        def post(c, w, table, out):
            from oracles.hadamard import hadamard_rotate
            from oracles.norm import rmsnorm
            from oracles.projections import nope_fp8_qdq
            from oracles.quant import fp4_qdq

            y = _rope_by_table(rmsnorm(c, w.float(), NORM_EPS), table)
            out.copy_(fp4_qdq(hadamard_rotate(y), 32) if params["indexer"] else nope_fp8_qdq(y))
        return post


@pytest.mark.parametrize("m, d, _ix", COMPRESSORS)
def test_push_adapter_updates_the_state_in_place_and_emits_at_block_ends(m, d, _ix):
    gen = torch.Generator().manual_seed(_seed())
    b, w = 3, d * (2 if overlaps(m) else 1)
    kv, score = torch.randn(b, 2 * m + 3, w, generator=gen), torch.randn(b, 2 * m + 3, w, generator=gen)
    ours = CompressorState.after_prefill(kv[:, :1], score[:, :1], m)
    ref = CompressorState.after_prefill(kv[:, :1], score[:, :1], m)
    run = _Emulated()
    for t in range(1, kv.shape[1]):
        kv_id = id(ours.kv)
        got = serves.compressor_push(run, ours, kv[:, t], score[:, t], t)
        want = ref.push(kv[:, t], score[:, t], t)
        assert id(ours.kv) == kv_id and torch.equal(ours.kv, ref.kv) and torch.equal(ours.score, ref.score)
        assert (got is None) == (want is None)
        if want is not None:
            assert got.shape == (b, d) and torch.allclose(got, want)
    assert {p["t"] for p in run.params} == set(range(1, kv.shape[1])) and all(p["d"] == d for p in run.params)


def test_push_adapter_refuses_a_state_it_cannot_update_in_place():
    state = CompressorState(2, 4, 1024)
    state.kv = state.kv.double()
    with pytest.raises(Unsupported):
        serves.compressor_push(_Emulated(), state, torch.randn(2, 1024), torch.randn(2, 1024), 7)


@pytest.mark.parametrize("m, d, indexer", COMPRESSORS)
def test_post_adapter_matches_the_oracle_with_its_table_rows(m, d, indexer):
    gen = torch.Generator().manual_seed(_seed())
    n = 6
    c = 2 * torch.randn(2, n, d, generator=gen)
    w = (1 + 0.3 * torch.randn(d, generator=gen)).bfloat16()
    ids = torch.randint(0, 1 << 16, (2, n), generator=gen)
    freqs = rope_freqs(COMPRESSED_ROPE)
    out = serves.compressor_post(_Emulated(), c, w, ids, m, freqs, indexer=indexer)
    ref = postprocess(c, w, ids, m, freqs, indexer=indexer)
    assert out.shape == c.shape and out.dtype == torch.float32
    assert (out - ref).abs().max() <= 2 * (postprocess_lowprec(c, w, ids, m, freqs, indexer=indexer).float()
                                         - ref).abs().max() + 1e-5


def test_post_adapter_refuses_what_the_kernel_does_not_compute():
    c, w, ids, freqs = torch.randn(2, 512), torch.ones(512), torch.zeros(2, dtype=torch.long), rope_freqs(COMPRESSED_ROPE)
    for kwargs in (dict(qat=False), dict(eps=1e-5)):
        with pytest.raises(Unsupported):
            serves.compressor_post(_Emulated(), c, w, ids, 4, freqs, **kwargs)


def test_the_served_ops_refuse_cpu_tensors():
    from dsv4bench.model.kernel_ops import served_ops

    state = CompressorState(1, 4, 1024)
    with pytest.raises(Unsupported):
        served_ops()["compressor_push"](state, torch.randn(1, 1024), torch.randn(1, 1024), 3)
    with pytest.raises(Unsupported):
        served_ops()["compressor_post"](torch.randn(1, 512), torch.ones(512), torch.zeros(1, dtype=torch.long), 4,
                                        rope_freqs(COMPRESSED_ROPE))


# --- GPU --------------------------------------------------------------------------------------------

GPU_CASES = _decode_cases(examples=12, seed=5)


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=[c.id for c in GPU_CASES])
def test_decode_case_matches_the_oracle(case, gpu_check):
    gpu_check(case)


@pytest.mark.gpu
@pytest.mark.parametrize("m, d, _ix", COMPRESSORS)
@pytest.mark.parametrize("batch, prefill", [(1, 0), (3, 5), (33, 2 * 128 + 1), (128, 4)])
def test_served_push_over_a_whole_decode(m, d, _ix, batch, prefill):
    """The state after a prefill of `prefill` tokens, then token after token through the served op on the
    GPU beside the oracle's `CompressorState.push`: every emitted entry by the tolerance rule (the bf16
    entry as the reference consumes it, against the fp32 oracle), the state bit for bit after each step."""
    from dsv4bench.model.kernel_ops import served_ops

    gen = torch.Generator().manual_seed(_seed())
    w = d * (2 if overlaps(m) else 1)
    steps = 2 * m + 3 if m == 4 else m + 2
    x = torch.randn(batch, prefill + steps, 64, generator=gen)
    wkv, wgate = torch.randn(w, 64, generator=gen) / 8, torch.randn(w, 64, generator=gen) / 4
    ape = torch.randn(m, w, generator=gen)
    kv, score = compressor_project(x, wkv, wgate, ape, torch.arange(x.shape[1]))
    ref = CompressorState.after_prefill(kv[:, :prefill], score[:, :prefill], m)
    ours = CompressorState.after_prefill(kv[:, :prefill], score[:, :prefill], m)
    ours.kv, ours.score = ours.kv.cuda(), ours.score.cuda()
    push = served_ops()["compressor_push"]
    emitted = 0
    for t in range(prefill, prefill + steps):
        want = ref.push(kv[:, t], score[:, t], t)
        got = push(ours, kv[:, t].cuda(), score[:, t].cuda(), t)
        assert torch.equal(ours.kv.cpu(), ref.kv) and torch.equal(ours.score.cpu(), ref.score), f"state after t = {t}"
        assert (got is None) == (want is None)
        if want is not None:
            emitted += 1
            ok, metrics = compare_outputs({"entry": got.cpu()}, {"entry": want}, {"entry": want.bfloat16()},
                                          lambda _: get_family("compressor_decode").tolerance)
            assert ok, (t, metrics["entry"].summary())
    assert emitted >= 1


@pytest.mark.gpu
@pytest.mark.parametrize("m, d, indexer", COMPRESSORS)
@pytest.mark.parametrize("rows", [1, 3, 32, 128, 1000])
def test_served_post_matches_the_oracle(m, d, indexer, rows):
    from dsv4bench.model.kernel_ops import served_ops

    gen = torch.Generator().manual_seed(_seed())
    c = (2 * torch.randn(rows, d, generator=gen)).cuda()
    w = (1 + 0.3 * torch.randn(d, generator=gen)).bfloat16().cuda()
    ids = torch.randint(0, (1 << 20) // m, (rows,), generator=gen).cuda()
    freqs = rope_freqs(COMPRESSED_ROPE).cuda()
    out = served_ops()["compressor_post"](c, w, ids, m, freqs, indexer=indexer)
    ref = postprocess(c, w, ids, m, freqs, indexer=indexer)
    low = postprocess_lowprec(c, w, ids, m, freqs, indexer=indexer)
    fam = get_family("compressor_decode")
    case = Case("compressor_decode", {"op": "post", "m": m, "b": rows, "d": d, "indexer": indexer, "dtype": "fp32"})
    pick = (lambda t: {"out": t}) if indexer else split
    ok, metrics = compare_outputs(pick(out), pick(ref), pick(low), lambda n: fam.tolerance_for(case, n))
    print({k: v.summary() for k, v in metrics.items()})
    assert ok


def test_the_tiny_model_runs_its_decode_through_the_adapters():
    """The embedded tiny checkpoint, a batch of two prompts of unequal lengths decoded past several
    block ends, with compressor_push / compressor_post served by the adapters (kernels emulated): the
    same logits as the oracle run, and the adapters called on every decode token / emission."""
    from functools import partial

    from dsv4bench.model import dispatch
    from dsv4bench.model.default import default_checkpoint
    from dsv4bench.model.dispatch import OpTable
    from dsv4bench.model.engine import Engine
    from dsv4bench.model.loader import Checkpoint

    run = _Emulated()
    dispatch.register_op("compressor_push", "emulated", partial(serves.compressor_push, run))
    dispatch.register_op("compressor_post", "emulated", partial(serves.compressor_post, run))
    try:
        logits = {}
        for backend in ("oracle", "emulated"):
            ops = OpTable({"compressor_push": backend, "compressor_post": backend})
            engine = Engine(Checkpoint.open(default_checkpoint()), device="cpu", ops=ops)
            steps = list(engine.generate_batch([[1, 17, 42, 99, 5], [7, 8, 9]], 9, 0.0, 0, stop_at_eos=False))
            logits[backend] = torch.stack([out.logits.reshape(-1) for _, _, out in steps])
            if backend == "emulated":
                assert ops.calls["compressor_push"] > 0 and ops.calls["compressor_post"] > 0 and not ops.refused
        err = (logits["emulated"] - logits["oracle"]).abs().max() / logits["oracle"].abs().max()
        print(f"max logit difference {err:.2e} of the largest")
        assert err < 1e-4
        assert {p["op"] for p in run.params} == {"push", "post"}
    finally:
        for op in ("compressor_push", "compressor_post"):
            dispatch._REGISTRY[op].pop("emulated", None)
