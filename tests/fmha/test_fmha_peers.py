"""The fmha peers' adapters: which cases each peer takes (CPU), and on a GPU that a taken case
matches the FP32 oracle under the same rule as ours, LSE included, and that a peer declining a
case at call time reads UNSUPPORTED, not FAIL_RUNTIME.

Found by `dsv4bench sweep fmha --hd 64,128,256,512` on the H100: the FlashMLA adapter scaled an
LSE that is already natural-log by ln 2 (every sink + LSE case failed), passed index lists that
FlashMLA asserts on (width not a multiple of 128), and cuDNN's "No available kernel" (s_q = s_kv
= 1) read as a runtime failure."""

import pytest
import torch

from dsv4bench.core.case import Case
from dsv4bench.core.compare import compare_outputs
from dsv4bench.core.evaluate import case_generator
from dsv4bench.core.worker import Worker
from kernels.fmha.family import FAMILY
from kernels.fmha.peers import CudnnSDPA, FlashMLA
from sweeps.fmha import WINDOW, _dense, _sparse


@pytest.mark.parametrize("topk,taken", [(WINDOW + 512, True), (WINDOW + 1024, True), (128, True), (135, False),
                                        (63, False), (1, False)])
def test_flashmla_takes_index_lists_in_whole_128_key_pairs(topk, taken):
    reason = FlashMLA().supports(Case("fmha", _sparse(h_q=64, topk=topk)))
    assert (reason is None) == taken, reason


def test_flashmla_declines_what_its_kernel_does_not_do():
    for params in (_sparse(hd=256), _sparse(h_q=32), _sparse(kv_shared=False), _dense(128, "causal")):
        assert FlashMLA().supports(Case("fmha", params)) is not None


def gpu(test):
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")(test))


@gpu
@pytest.mark.parametrize("h_q,topk", [(64, WINDOW + 512), (128, WINDOW + 1024)])
@pytest.mark.parametrize("invalid", [0.0, 0.25])
def test_flashmla_matches_the_oracle_with_sink_and_lse(h_q, topk, invalid):
    if FlashMLA().available():
        pytest.skip(FlashMLA().available())
    case = Case("fmha", _sparse(h_q=h_q, topk=topk, s_q=193, invalid=invalid, sink=True, lse=True))
    x = FAMILY.make_inputs(case, case_generator(case), "cuda")
    res = FlashMLA().run(case, x, FAMILY.alloc_outputs(case, "cuda"), None)
    ok, metrics = compare_outputs(res, FAMILY.oracle(case, x), FAMILY.lowprec(case, x),
                                  lambda n: FAMILY.tolerance_for(case, n))
    assert ok, {k: m.summary() for k, m in metrics.items()}


@gpu
def test_a_peer_declining_at_call_time_reads_unsupported():
    case = Case("fmha", _dense(64, "none", b=1, h_q=1, h_kv=1, s_q=1, s_kv=1, lse=False))
    assert CudnnSDPA().supports(case) is None  # nothing in the rules excludes it: cuDNN's dispatch does
    task = {"run_id": "r", "key": "k", "case": case.to_json(), "impl": "cudnn", "arch": "any", "mode": "run",
            "device": "cuda"}
    rec = Worker().handle(task)
    assert rec.status in ("UNSUPPORTED", "PASS"), (rec.status, rec.reason)  # PASS where cuDNN has a kernel
    if rec.status == "UNSUPPORTED":
        assert "No available kernel" in rec.reason
