"""The reference engine: incremental decode equals a full-prefill recompute at every step, across
the CSA and HCA compression boundaries; chunking, MTP drafts, determinism and the dispatch table."""

import random
import re

import pytest
import torch

from dsv4bench.model.config import TINY
from dsv4bench.model.dispatch import DispatchError, OpTable, register_op
from dsv4bench.model.engine import Engine
from dsv4bench.model.loader import Checkpoint
from dsv4bench.model.synth import write_checkpoint
from oracles.head import sample
from oracles.norm import rmsnorm

PARITY_RTOL = 1e-4


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    seed = random.randrange(1 << 30)
    print(f"tiny checkpoint seed {seed}")  # shown with a failure, to replay it
    return Checkpoint.open(write_checkpoint(TINY, tmp_path_factory.mktemp("tiny"), seed=seed))


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def test_decode_matches_full_prefill_at_every_step(ckpt):
    """384 generated tokens after a prompt of random length (the prefill leaves partial and, past
    128, complete blocks in the compressor states): HCA (m=128) emits >= 3 entries, CSA ~100."""
    dec, ref = Engine(ckpt, qat=False), Engine(ckpt, qat=False)  # pure FP32: QAT rounding can flip on roundoff
    seed = random.randrange(1 << 30)
    print(f"generation seed {seed}")
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(2, TINY.vocab_size, (int(torch.randint(1, 161, (), generator=gen)),), generator=gen).tolist()
    steps, out, ids = [], dec.feed(prompt), list(prompt)
    for _ in range(384):  # a sampled generation, decoded one token at a time
        steps.append((len(ids), out))
        ids.append(int(sample(out.logits, 1.0, gen)))
        out = dec.feed([ids[-1]])
    steps.append((len(ids), out))
    assert [c.comp_kv.shape[1] for c in dec.caches] == [0, len(ids) // 4, len(ids) // 128, len(ids) // 4]
    assert len(ids) // 128 >= 3 and dec.caches[1].idx_keys.shape[1] == len(ids) // 4

    full = ref.feed(ids, all_logits=True)  # row t = what a prefill of ids[:t+1] ends with
    worst = max(rel(o.logits, full.logits[n - 1]) for n, o in steps)
    worst_draft = max(rel(o.draft_logits, full.draft_logits[n - 2]) for n, o in steps if n > 1)
    assert worst < PARITY_RTOL, worst
    assert worst_draft < PARITY_RTOL, worst_draft

    # and a genuinely fresh prefill of the prefix, at and around the compression boundaries
    by_len = dict(steps)
    for n in (len(prompt) + 1, 127, 128, 129, 256, 257, 300, 384, len(ids)):
        if n not in by_len or n < 2:
            continue
        ref.reset()
        r = ref.feed(ids[:n])
        assert rel(by_len[n].logits, r.logits) < PARITY_RTOL, n
        assert rel(by_len[n].draft_logits, r.draft_logits) < PARITY_RTOL, n


def test_chunked_prefill_matches_one_prefill(ckpt):
    eng = Engine(ckpt, qat=False)  # pure FP32 (see above)
    ids = torch.randint(2, TINY.vocab_size, (300,)).tolist()
    whole = eng.feed(ids)
    eng.reset()
    cuts = sorted(random.sample(range(1, 300), 6))
    for a, b in zip([0] + cuts, cuts + [300]):
        part = eng.feed(ids[a:b])
    assert rel(part.logits, whole.logits) < PARITY_RTOL
    assert rel(part.draft_logits, whole.draft_logits) < PARITY_RTOL


def test_nvfp4_experts_give_the_same_model(ckpt, tmp_path):
    """Re-express the MXFP4 experts exactly as NVFP4 (same nibbles, per-16 e4m3 scales = the
    per-32 powers of two, global scale 1): the NVFP4 load path must give the same logits."""
    from safetensors.torch import load_file, save_file

    out = tmp_path / "nv"
    out.mkdir()
    for src in ckpt.root.iterdir():
        if src.suffix != ".safetensors":
            (out / src.name).write_bytes(src.read_bytes())
            continue
        ts = {k: v.clone() for k, v in load_file(str(src)).items()}
        for name in [n for n in ts if ".experts." in n and n.endswith(".weight")]:
            base = name[: -len(".weight")]
            scale = ts.pop(f"{base}.scale").view(torch.uint8).int() - 127
            ts[name] = ts[name].view(torch.uint8)
            ts[f"{base}.weight_scale"] = torch.exp2(scale.float()).repeat_interleave(2, -1).to(torch.float8_e4m3fn)
            ts[f"{base}.weight_scale_2"] = torch.tensor(1.0)
            ts[f"{base}.input_scale"] = torch.tensor(1.0)
        save_file(ts, str(out / src.name), metadata={"format": "pt"})
    import json

    index = json.loads((out / "model.safetensors.index.json").read_text())
    index["weight_map"] = {n: f for src in out.glob("*.safetensors")
                           for n, f in ((n, src.name) for n in load_file(str(src)))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    nv = Checkpoint.open(out)
    assert nv.config.expert_dtype == "nvfp4"
    ids = torch.randint(2, TINY.vocab_size, (40,)).tolist()
    a, b = Engine(ckpt).feed(ids), Engine(nv).feed(ids)
    assert rel(b.logits, a.logits) < 1e-6


def test_generate_is_deterministic_for_a_seed(ckpt):
    eng = Engine(ckpt)
    prompt = [TINY.bos_token_id] + torch.randint(2, 258, (5,)).tolist()
    run = lambda seed: [t for t, _ in eng.generate(prompt, 12, temperature=0.8, seed=seed, stop_at_eos=False)]  # noqa: E731
    first = run(11)
    assert len(first) == 12 and run(11) == first
    assert run(12) != first


@pytest.mark.parametrize("bad", [-1, "vocab", "far"])
def test_an_id_outside_the_vocabulary_is_named_before_any_kernel_runs(ckpt, bad):
    """On the GPU an out-of-range gather traps and kills the CUDA context: feed names the id first,
    whether the ids come as a list, a [B, S] tensor or a 0-d one, and leaves the caches as they were."""
    eng = Engine(ckpt)
    v = TINY.vocab_size
    wrong = {-1: -1, "vocab": v, "far": v + random.randrange(1, 1 << 20)}[bad]
    ids = torch.randint(0, v, (7,)).tolist()
    at = random.randrange(7)
    ids[at] = wrong
    for given, where in ((ids, f"({at},)"), (torch.tensor([ids]), f"(0, {at})")):
        with pytest.raises(ValueError, match=re.escape(f"token id {wrong} at index {where} is outside the vocabulary [0, {v})")):
            eng.feed(given)
    with pytest.raises(ValueError, match=f"token id {wrong} at index"):
        eng.feed(torch.tensor(wrong))
    assert eng.pos == 0
    edge = torch.tensor([0, v - 1])
    assert eng.feed(edge).logits.shape == (v,) and eng.pos == 2


def test_a_registered_backend_is_dispatched_and_reported(ckpt):
    calls = []

    def noisy_rmsnorm(x, weight=None, eps=1e-6):
        calls.append(x.shape)
        return rmsnorm(x, weight, eps) * 1.01

    register_op("rmsnorm", "test-noisy", noisy_rmsnorm)
    ids = torch.randint(2, TINY.vocab_size, (20,)).tolist()
    base = Engine(ckpt).feed(ids).logits
    ops = OpTable().select({"rmsnorm": "test-noisy"})
    eng = Engine(ckpt, ops=ops)
    swapped = eng.feed(ids).logits
    report = {op: (be, n) for op, be, n, _ in ops.report()}
    assert report["rmsnorm"] == ("test-noisy", len(calls)) and len(calls) > 0
    assert report["moe"][0] == "oracle" and report["sparse_attention"][1] > 0
    assert rel(swapped, base) > 1e-3  # the swap really changed the math
    eng.ops.select({"rmsnorm": "oracle"})
    eng.reset()
    assert rel(eng.feed(ids).logits, base) < 1e-6
    with pytest.raises(DispatchError, match="unknown op 'nope'"):
        register_op("nope", "x", noisy_rmsnorm)
    with pytest.raises(DispatchError, match="has no backend 'no-such-backend'"):
        OpTable().select({"rmsnorm": "no-such-backend"})
