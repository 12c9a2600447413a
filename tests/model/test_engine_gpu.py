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
