"""Every model op a kernel family serves (Family.serves), against the op's FP32 oracle on the
arguments the model really passes: a prefill + decode run of the embedded tiny checkpoint on the
CPU records the first calls of each op; on a GPU (marked `gpu`) each served op replays them on its
kernel. Nothing here names a family: a new `serves` entry is checked the day it lands."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.core.registry import Unsupported
from dsv4bench.model.dispatch import OPS, OpTable, register_kernel_ops
from dsv4bench.model.error import Error
from dsv4bench.model.kernel_ops import served_ops

SERVED = sorted(served_ops())
CALLS_PER_OP = 2  # the prefill call and a decode call
REL_ERR = 2e-2  # bf16 kernels inside an fp32 model: a few bf16 roundings of the op's output


class RecordingOps(OpTable):
    """An oracle OpTable that keeps the arguments of the first calls of each op."""

    def __init__(self):
        super().__init__()
        self.seen: dict[str, list] = {op: [] for op in OPS}

    def __getattr__(self, op):
        call = super().__getattr__(op)

        def record(*args, **kwargs):
            if len(self.seen[op]) < CALLS_PER_OP:
                self.seen[op].append((args, kwargs))
            return call(*args, **kwargs)

        return record


@pytest.fixture(scope="module")
def recorded():
    from dsv4bench.model.default import default_checkpoint
    from dsv4bench.model.engine import Engine
    from dsv4bench.model.loader import Checkpoint

    ops = RecordingOps()
    engine = Engine(Checkpoint.open(default_checkpoint()), device="cpu", ops=ops)
    # 7 prompt tokens: the first decode step, at position 7, completes a CSA block (compressor_post runs)
    for _ in engine.generate([1, 17, 42, 99, 5, 23, 8], 2, 0.0, 0):
        pass
    return ops.seen


def _to(x, device):
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, (list, tuple)):
        moved = [_to(v, device) for v in x]
        return type(x)(*moved) if hasattr(x, "_fields") else type(x)(moved)  # a namedtuple (QuantWeight)
    return x


def _by_index(outputs):
    """Outputs holding an index tensor (router: weights, ids) in the order of the ids, row by row:
    a kernel may list a row's picks in another order."""
    ids = next((t for t in outputs if not t.is_floating_point()), None)
    if ids is None:
        return outputs
    order = ids.cpu().long().argsort(dim=-1)
    return tuple(t.cpu().gather(-1, order) if t.shape == ids.shape else t for t in outputs)


def _rel_err(out, ref) -> float:
    if isinstance(ref, (tuple, list)):
        return max(_rel_err(o, r) for o, r in zip(_by_index(out), _by_index(ref)))
    if not ref.is_floating_point():  # ids compare as sets per row (a top-k is a set), as run-model --compare does
        ids = Error()
        ids.add(out.cpu(), ref.cpu())
        return 0.0 if ids.bad_rows == 0 else float("inf")
    return float((out.cpu().double() - ref.cpu().double()).norm() / ref.cpu().double().norm().clamp_min(1e-30))


def test_every_served_op_is_a_model_op():
    assert set(SERVED) <= set(OPS), sorted(set(SERVED) - set(OPS))
    served = register_kernel_ops()
    assert set(served) == set(SERVED) and all(served.values())


def test_the_tiny_model_calls_every_served_op(recorded):
    assert all(recorded[op] for op in SERVED), [op for op in SERVED if not recorded[op]]


@pytest.mark.gpu
@pytest.mark.parametrize("op", SERVED)
def test_served_op_matches_its_oracle_on_model_inputs(op, recorded):
    kernel_op = served_ops()[op]
    for args, kwargs in recorded[op]:
        ref = OPS[op].oracle(*args, **kwargs)
        try:
            out = kernel_op(*_to(args, "cuda"), **_to(kwargs, "cuda"))
        except Unsupported as e:  # the tiny model's shapes are not the kernel's contract: say so
            pytest.skip(str(e))
        err = _rel_err(out, ref)
        print(op, kernel_op.describe(), f"relative error {err:.2e}")
        assert err <= REL_ERR, f"{op} on {kernel_op.describe()}: relative error {err:.2e}"
