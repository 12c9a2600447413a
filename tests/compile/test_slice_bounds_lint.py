"""Lint `slice-bounds`: the RMSNorm v1 bug (docs/lessons/rmsnorm.md) as a planted kernel.

A thread's copy partition is ((vec, V), 1, 1); indexing vector j in mode 2 (size 1, stride 0)
compiles and runs without complaint but moves the whole fragment. The lint flags it at trace time;
the correct twin, indexing (None, j) inside mode 0, passes.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from dsv4bench.compile.lints import lint
from kernels.trace import record_slice, recording
from kernels.common import compile_kernel, fake_rowmajor

THREADS, VEC, VECS = 32, 8, 4


class VectorCopy:
    def __init__(self, buggy: bool):
        self.buggy = buggy

    @cute.jit
    def __call__(self, mX: cute.Tensor, mO: cute.Tensor, stream):
        self.kernel(mX, mO).launch(grid=[1, 1, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mO: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        tiler = (1, THREADS * VEC * VECS)
        tv = cute.make_layout(((THREADS, 1), (VEC, VECS)), stride=((VEC, 1), (1, THREADS * VEC)))
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), mX.element_type, num_bits_per_copy=128)
        thr = cute.make_tiled_copy(atom, tv, tiler).get_slice(tidx)
        tXgX = thr.partition_S(cute.local_tile(mX, tiler, (0, 0)))
        tXgO = thr.partition_D(cute.local_tile(mO, tiler, (0, 0)))
        frag = cute.make_fragment_like(tXgX)
        for j in cutlass.range_constexpr(VECS):
            coord = (None, None, j) if self.buggy else ((None, j), None, None)
            cute.copy(atom, record_slice("x vector j", tXgX, coord), record_slice("x vector j (registers)", frag, coord))
            cute.copy(atom, record_slice("x vector j (registers)", frag, coord), record_slice("y vector j", tXgO, coord))


def lint_compile(buggy: bool):
    cols = THREADS * VEC * VECS
    with recording() as rec:
        compile_kernel(VectorCopy(buggy), fake_rowmajor("bf16", (1, cols)), fake_rowmajor("bf16", (1, cols)),
                       arch="sm_90a")
    return rec, lint(rec)


def test_vector_index_in_a_size_one_mode_is_flagged():
    rec, findings = lint_compile(buggy=True)
    assert {f.rule for f in findings} == {"slice-bounds"}
    first = findings[0]
    assert first.stage == "x vector j" and "indexes mode (2,) (size 1) at 1" in first.message
    assert sum(f["rule"] == "slice-bounds" for f in rec.facts) == 4 * VECS  # every call checked
    assert [e["stage"] for e in rec.entries].count("x vector j") == 1  # listed once


def test_correct_twin_passes():
    rec, findings = lint_compile(buggy=False)
    assert findings == [] and any(f["rule"] == "slice-bounds" for f in rec.facts)
