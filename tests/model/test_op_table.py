"""The kernel backend's op table is complete: every op the model calls has a kernel registered
(backend "cutedsl", from the families' `serves`) or is on `ORACLE_ONLY` with the reason."""

import pytest
import torch

from dsv4bench.model.dispatch import OPS, ORACLE_ONLY, OpTable, has_backend, register_kernel_ops, serving_table
from dsv4bench.model.kernel_ops import KERNEL


def test_every_op_has_a_kernel_or_a_reason():
    served = register_kernel_ops()
    assert served, "no kernel family serves any op"
    for op in OPS:
        kernel = has_backend(op, KERNEL)
        assert kernel == (op in served), op
        assert kernel != (op in ORACLE_ONLY), f"{op}: " + ("served by a kernel and still on ORACLE_ONLY" if kernel
                                                           else "no kernel and not on ORACLE_ONLY")
    assert set(ORACLE_ONLY) <= set(OPS), set(ORACLE_ONLY) - set(OPS)
    assert all(len(why.split()) >= 3 for why in ORACLE_ONLY.values())  # a reason, not a placeholder


def test_the_serving_table_names_every_oracle_only_op_with_its_reason():
    register_kernel_ops()
    rows = dict(serving_table(KERNEL))
    assert list(rows) == list(OPS)
    for op, by in rows.items():
        assert by == f"oracle ({ORACLE_ONLY[op]})" if op in ORACLE_ONLY else by.endswith(")") and "/" in by, (op, by)


def test_the_model_calls_exactly_the_ops_of_the_table(tiny_engine):
    """Prefill, decode (compressor pushes), the MTP block and the sampler: every op of OPS runs,
    and the model calls nothing else (the table refuses unknown ops)."""
    seen = set()
    ops = OpTable()
    ops.trace = lambda scope, op, out: seen.add(op)
    tiny_engine.ops = ops
    prompt = torch.randint(2, 512, (int(torch.randint(5, 30, ())),)).tolist()
    for _ in tiny_engine.generate(prompt, 6, temperature=0.7, seed=1, stop_at_eos=False):
        pass
    assert seen == set(OPS), set(OPS) ^ seen
    assert all(n > 0 for _, _, n, _ in ops.report())


def test_a_call_the_kernel_refuses_runs_on_the_oracle_and_is_counted(tiny_engine):
    """A kernel raising Unsupported for a shape (the FP8 GEMM on the tiny model's widths) does not stop
    the run: that call runs on the oracle, and the table counts it with the first reason."""
    from dsv4bench.core.registry import Unsupported
    from dsv4bench.model import dispatch

    oracle = OPS["rmsnorm"].oracle
    taken = []

    def half_refusing(x, *args, **kwargs):
        if x.shape[0] % 2:
            raise Unsupported(f"odd row count {x.shape[0]}")
        taken.append(x.shape[0])
        return oracle(x, *args, **kwargs) * 2  # visibly not the oracle

    dispatch.register_op("rmsnorm", "half_refusing", half_refusing)
    try:
        ops = OpTable({"rmsnorm": "half_refusing"})
        x, w = torch.randn(3, 8), torch.randn(8)
        assert torch.equal(ops.rmsnorm(x, w, 1e-6), oracle(x, w, 1e-6))
        assert torch.equal(ops.rmsnorm(x[:2], w, 1e-6), 2 * oracle(x[:2], w, 1e-6))
        assert ops.refused == {"rmsnorm": (1, "odd row count 3")} and taken == [2]
        assert ops.calls["rmsnorm"] == 2
        plain = OpTable()
        plain.rmsnorm(x, w, 1e-6)
        assert plain.refused == {}
    finally:
        del dispatch._REGISTRY["rmsnorm"]["half_refusing"]


def test_a_kernel_op_does_its_checks_and_lookups_once_per_params(monkeypatch):
    """KernelOp.compile on params it has seen skips the case, `supports` and the compile cache (host
    time at decode), but still checks every call's inputs; a refusal is checked again each call."""
    from types import SimpleNamespace

    from dsv4bench.core.registry import Unsupported, get_family
    from dsv4bench.model import kernel_ops

    monkeypatch.setattr(kernel_ops, "device_arch", lambda: "sm_90a")
    op = kernel_ops.KernelOp(get_family("rmsnorm"), "rmsnorm", None)
    lookups = []
    op._cache = SimpleNamespace(get=lambda impl, case, arch: (lookups.append(case) or (f"kernel {case.id}", None)))
    cuda = {"x": SimpleNamespace(device=SimpleNamespace(type="cuda"))}
    params = op.family.space.production()[0]
    first = op.compile(params, cuda)
    assert op.compile(dict(params), cuda) is first and len(lookups) == 1
    other = op.compile(dict(params, m=params["m"] + 1), cuda)
    assert other[1] != first[1] and len(lookups) == 2
    with pytest.raises(Unsupported, match="takes CUDA tensors"):
        op.compile(params, {"x": torch.zeros(1)})
    monkeypatch.setattr(op.impl, "supports", lambda case, arch: "no" if case["m"] == 7 else None)
    for _ in range(2):  # a refusal is not remembered as a kernel
        with pytest.raises(Unsupported, match="does not take"):
            op.compile(dict(params, m=7), cuda)
    assert len(lookups) == 2
    assert kernel_ops._params_key({"lens": [3, 4], "t": 2}, "sm_90a") == ("sm_90a", ("lens", (3, 4)), ("t", 2))
    assert kernel_ops._params_key({"x": {1: 2}}, "sm_90a") is None  # not hashable: no memo, the full path
