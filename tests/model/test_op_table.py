"""The kernel backend's op table is complete: every op the model calls has a kernel registered
(backend "cutedsl", from the families' `serves`) or is on `ORACLE_ONLY` with the reason."""

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
