"""The gathered-key attention kernel compiled from fake tensors (no GPU needed): what the prefill glue
and the FP8 decode glue both build on."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_tensor

from kernels.common import compile_kernel
from kernels.fmha.config import Config
from kernels.fmha.kernel_sm90 import GatherAttentionSm90

NO_WINDOW = 1 << 30  # the window argument when a case has none


def fake_args(cfg: Config) -> tuple:
    """Fake (s, h, d, b) tensors with runtime sizes; d is contiguous and strides are 16-byte multiples."""
    s_q, h_q, s_kv, h_kv, b, rows, n = (cute.sym_int32() for _ in range(7))

    def s8():
        return cute.sym_int64(divisibility=8)

    bf = cutlass.BFloat16
    q = make_fake_tensor(bf, (s_q, h_q, cfg.d, b), (s8(), s8(), 1, s8()), assumed_align=16)
    k = make_fake_tensor(bf, (s_kv, h_kv, cfg.d, b), (s8(), s8(), 1, s8()), assumed_align=16)
    v = make_fake_tensor(bf, (s_kv, h_kv, cfg.dv, b), (s8(), s8(), 1, s8()), assumed_align=16)
    idx = make_fake_tensor(cutlass.Int32, (rows, n, b), (cute.sym_int64(), 1, cute.sym_int64()), assumed_align=4)
    lens = make_fake_tensor(cutlass.Int32, (rows, b), (1, cute.sym_int64()), assumed_align=4)
    sink = make_fake_tensor(cutlass.Float32, (h_q,), (1,), assumed_align=4)
    o = make_fake_tensor(bf, (s_q, h_q, cfg.dv, b), (s8(), s8(), 1, s8()), assumed_align=16)
    lse = make_fake_tensor(cutlass.Float32, (s_q, h_q, b), (cute.sym_int64(), cute.sym_int64(), cute.sym_int64()),
                           assumed_align=4)
    return q, k, v, idx, lens, sink, o, lse, cutlass.Float32(1.0), cutlass.Int32(0), cutlass.Int32(0), cutlass.Int32(1)


def compile_config(cfg: Config, arch: str, kernel_class: type = GatherAttentionSm90):
    """Compile the kernel (or a variant's subclass of it) for one Config (no GPU needed); layouts
    go to an active recorder."""
    return compile_kernel(kernel_class(cfg), *fake_args(cfg), arch=arch)
