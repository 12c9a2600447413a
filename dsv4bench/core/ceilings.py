"""The device's measured limits, taken in the same run as the kernels they judge.

Percent-of-limit figures use these, never datasheet peaks: the device-to-device copy bandwidth
(bytes read + written) and the dense bf16 GEMM throughput.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from dsv4bench.core.timing import CudaTimer


@dataclass
class Ceilings:
    copy_gbps: float
    gemm_bf16_tflops: float

    def to_json(self) -> dict:
        return asdict(self)


def measure(device: str = "cuda") -> Ceilings:
    import torch

    timer = CudaTimer(device)
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_ms = timer.time(lambda: dst.copy_(src), min_iters=20).median_ms
    n = 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    gemm_ms = timer.time(lambda: a @ b, min_iters=10, max_iters=20).median_ms
    del src, dst, a, b
    return Ceilings(2 * (1 << 30) / copy_ms / 1e6, 2 * n**3 / gemm_ms / 1e9)
