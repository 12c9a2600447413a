"""The device's measured limits, taken in the same run as the kernels they judge.

Percent-of-limit figures use these, never datasheet peaks: the device-to-device copy bandwidth
(bytes read + written) and the dense bf16 GEMM throughput. A 1 GiB copy gives the streaming
bandwidth; a small op cannot reach it (launch, ramp-up and tail are a fixed cost), so each timed
case is also measured against a device copy moving the same number of bytes, timed the same way:
that copy's time is the demonstrated floor of a memory-bound op of that size.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from dsv4bench.core.timing import CudaTimer


@dataclass
class Ceilings:
    copy_gbps: float
    gemm_bf16_tflops: float

    def to_json(self) -> dict:
        return asdict(self)


def _copy_gbps(timer: CudaTimer, device: str) -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = timer.time(lambda: dst.copy_(src), min_iters=20).median_ms
    return 2 * src.numel() / ms / 1e6  # bytes read + written


COPY_GRAIN = 4096


FLOOR_TIMINGS = 3  # timings of each floor copy; the floor is the fastest median (a transient must not inflate it)


class SameTrafficCopy:
    """Time of a device copy that reads and writes `nbytes` in all (nbytes / 2 each way, up to 4 KiB
    more), cached per size: the floor a memory-bound op moving `nbytes` is judged against. The least of
    FLOOR_TIMINGS medians: one timing of a process once came out 5-6x its neighbours' (two quant sizes, 2026-11-27,
    docs/lessons/harness.md 17), and a cached floor keeps what it first measured."""

    def __init__(self, timer: CudaTimer, device: str):
        self.timer, self.device = timer, device
        self._ms: dict[int, float] = {}

    @staticmethod
    def half_bytes(nbytes: float) -> int:
        """Bytes each way: half of nbytes rounded up to whole 4 KiB. torch's device copy of a byte count
        that is not a multiple of 4 KiB ran ~3 us slower on the H100 at 2.3-59 MB (docs/lessons/harness.md
        15), which made the floor of every op it judged that much too slow."""
        return max(COPY_GRAIN, -(-int(nbytes) // 2 // COPY_GRAIN) * COPY_GRAIN)  # cost models count bytes as floats

    def ms(self, nbytes: int) -> float:
        half = self.half_bytes(nbytes)
        if half not in self._ms:
            src = torch.empty(half, dtype=torch.uint8, device=self.device)
            dst = torch.empty_like(src)
            self._ms[half] = min(self.timer.time(lambda: dst.copy_(src), min_iters=20).median_ms
                                 for _ in range(FLOOR_TIMINGS))
            del src, dst
        return self._ms[half]


def _gemm_tflops(timer: CudaTimer, device: str, n: int = 8192) -> float:
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    ms = timer.time(lambda: a @ b, min_iters=10, max_iters=20).median_ms
    return 2 * n**3 / ms / 1e9


def measure(device: str = "cuda") -> Ceilings:
    timer = CudaTimer(device)
    return Ceilings(_copy_gbps(timer, device), _gemm_tflops(timer, device))
