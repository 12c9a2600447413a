"""The model on the GPU: the FP32 oracle model gives the CPU's logits (the oracles must keep their
tables on the input's device), and the kernel backend runs end to end — every call a kernel refuses
(the tiny model's widths are below the FP8 GEMM's) on the oracle, counted — close to it."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.model.dispatch import OpTable, register_kernel_ops
from dsv4bench.model.engine import Engine
from dsv4bench.model.kernel_ops import KERNEL

pytestmark = pytest.mark.gpu


def _logits(engine: Engine, prompt: list[int], steps: int) -> torch.Tensor:
    engine.reset()
    out = [engine.feed(prompt).logits]
    for _ in range(steps):
        out.append(engine.feed([int(out[-1].argmax())]).logits)
    return torch.stack(out).cpu()


def test_oracle_and_kernel_models_on_cuda(tmp_path):
    from dsv4bench.model.config import TINY
    from dsv4bench.model.loader import Checkpoint
    from dsv4bench.model.synth import write_checkpoint

    seed = int(torch.randint(1 << 30, ()))
    print("tiny checkpoint seed", seed)
    ckpt = Checkpoint.open(write_checkpoint(TINY, tmp_path, seed=seed))
    prompt = torch.randint(2, 500, (37,)).tolist()
    cpu = _logits(Engine(ckpt), prompt, 3)
    gpu_oracle = _logits(Engine(ckpt, device="cuda"), prompt, 3)
    torch.testing.assert_close(gpu_oracle, cpu, rtol=1e-3, atol=1e-3)
    register_kernel_ops()
    ops = OpTable().select_all(KERNEL)
    kernel = _logits(Engine(ckpt, device="cuda", ops=ops), prompt, 3)
    rel = float((kernel - cpu).norm() / cpu.norm())
    print("kernel model: relative error of the logits", rel, "refused:", ops.refused)
    assert rel < 2e-2
    assert sum(ops.calls.values()) > 0 and all(n > 0 for n, _ in ops.refused.values())


def test_the_kernel_model_at_kernel_widths_serves_the_new_ops():
    """A random model at widths every served op takes (128-multiples, 64 indexer heads): the ops served
    beyond the projections run on their kernels, moe (8 experts of 256 x 256, top-2) and the indexer
    compressor's prefill included: no call is refused; teacher-forced logits stay as close to FP32 as
    the bf16 low-precision model's, with most top-1 picks."""
    from dsv4bench.model.config import TINY
    from dsv4bench.model.lowprec_ops import LOWPREC, register_lowprec_ops
    from dsv4bench.model.synthetic import SyntheticCheckpoint

    cfg = TINY.with_(dim=256, q_lora_rank=256, o_lora_rank=256, moe_inter_dim=256, index_n_heads=64)
    seed = int(torch.randint(1 << 30, ()))
    print("weights seed", seed)
    ckpt = SyntheticCheckpoint(cfg, seed)
    prompt = torch.randint(2, cfg.vocab_size, (int(torch.randint(20, 60, ())),)).tolist()

    def logits(ops):
        engine = Engine(ckpt, device="cuda", ops=ops)
        out = engine.feed(prompt, all_logits=True).logits.float()
        last = out[-1]
        for _ in range(6):  # decode steps: the sampler, compressor pushes, decode-time indexer scores
            last = engine.feed([int(engine.ops.sample(last, 0.0))]).logits
        return out.cpu()

    register_kernel_ops()
    register_lowprec_ops()
    ref = logits(OpTable())
    kernel_ops = OpTable().select_all(KERNEL)
    kernel, low = logits(kernel_ops), logits(OpTable().select_all(LOWPREC))
    for op in ("indexer_queries", "indexer_scores", "mtp_input", "sample", "compressor_prefill", "moe", "embed",
               "lm_head", "compressor_project", "compressor_push", "compressor_post", "indexer_weights"):
        assert kernel_ops.active[op] == KERNEL and kernel_ops.calls[op] > 0, op
    assert not kernel_ops.refused, kernel_ops.refused
    rel, low_rel = (float((x - ref).norm() / ref.norm()) for x in (kernel, low))
    print(f"logits vs FP32: kernel {rel:.3g}, lowprec {low_rel:.3g}; refused {kernel_ops.refused}")
    assert rel < 2 * low_rel + 0.02
    assert float((kernel.argmax(-1) == ref.argmax(-1)).float().mean()) >= 0.7
