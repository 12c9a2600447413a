"""The dense ping-pong's schedule as ptxas emits it (SASS, sm_90a, no GPU): a warpgroup's softmax
of S(kt) must run while its PV(kt-1) is still on the tensor cores, i.e. the exponentials must sit
between the loop's wait for S(kt) (`WARPGROUP.DEPBAR.LE gsb0, 0x1`) and its wait for PV(kt-1)
(`... 0x0`). In one straight-line block ptxas hoists the second wait above the softmax (FA4's SM90
kernel has the same hoist); v10 puts the wait in both arms of the O-rescale vote, which kept it
below (dense hd128 0.89 -> 0.84 ms on the H100, docs/perf/fmha.md). The planted twin, the wait
back in the straight-line block, must be caught by the same check."""

import cutlass.cute as cute
import pytest
from cutlass.cute.nvgpu import warpgroup

from dsv4bench.compile.sass import find_nvdisasm, sass_of
from kernels.common import compile_kernel
from kernels.fmha.config import Config
from kernels.fmha.kernel_sm90 import GatherAttentionSm90
from kernels.fmha.softmax import any_moved, scale_rows
from kernels.fmha.compiling import fake_args

pytestmark = pytest.mark.skipif(find_nvdisasm() is None,
                                reason="no nvdisasm ($DSV4BENCH_NVDISASM, PATH, pip nvidia-cuda-nvdisasm)")


class WaitAboveSoftmax(GatherAttentionSm90):
    """The pre-v10 order: the wait for PV(kt-1) in the block that holds the softmax."""

    @cute.jit
    def _wait_pv_rescale_o(self, O_mn, corr):
        warpgroup.wait_group(0)
        if any_moved(corr):
            scale_rows(O_mn, corr)


def exps_under_pv(cls, cfg: Config) -> int:
    """MUFU.EX2 between the ping-pong loop's wait for S(kt) and its wait for PV(kt-1)."""
    lines = sass_of(compile_kernel(cls(cfg), *fake_args(cfg), arch="sm_90a")).splitlines()
    start = next(i for i, line in enumerate(lines) if "WARPGROUP.DEPBAR.LE gsb0, 0x1" in line)
    end = next(i for i in range(start, len(lines)) if "WARPGROUP.DEPBAR.LE gsb0, 0x0" in lines[i])
    return sum("MUFU.EX2" in line for line in lines[start:end])


@pytest.mark.parametrize("d,causal", [(128, False), (128, True), (256, False)])
def test_softmax_runs_under_the_previous_pv(d, causal):
    cfg = Config(d=d, dv=d, hpg=1, kv_shared=False, per_token_idx=False, causal=causal)
    per_thread = 2 * cfg.n_block // 4  # two rows of S per thread, a quad shares each row
    n = exps_under_pv(GatherAttentionSm90, cfg)
    print(cfg, "exps between the waits:", n, "of", per_thread)
    assert n >= per_thread


def test_planted_wait_above_the_softmax_is_caught():
    cfg = Config(d=128, dv=128, hpg=1, kv_shared=False, per_token_idx=False)
    n = exps_under_pv(WaitAboveSoftmax, cfg)
    print("planted: exps between the waits:", n)
    assert n < cfg.n_block // 4
