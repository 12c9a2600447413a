"""Adding a family touches one place: a toy family written into a temporary directory as
`kernels/toy/`, `oracles/toy.py`, `sweeps/toy.py` and `tests/toy/` — nothing in the repository is
edited — is listed, swept compile-only, replayed by `repro`, and passes the generic conformance
tests, the way a contributor would run them (subprocesses with the directory on PYTHONPATH)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.core.helpers import ROOT, cli_env

FILES = {
    "kernels/toy/__init__.py": "",
    "kernels/toy/affine.py": '''
        """out = 2·x + 1 over a flat bf16 tensor, one element per thread."""

        import cutlass
        import cutlass.cute as cute

        THREADS = 128


        class AffineKernel:
            @cute.jit
            def __call__(self, x: cute.Tensor, out: cute.Tensor, stream):
                blocks = (cute.size(x) + THREADS - 1) // THREADS
                self.kernel(x, out).launch(grid=[blocks, 1, 1], block=[THREADS, 1, 1], stream=stream)

            @cute.kernel
            def kernel(self, x: cute.Tensor, out: cute.Tensor):
                tidx, _, _ = cute.arch.thread_idx()
                bidx, _, _ = cute.arch.block_idx()
                i = bidx * THREADS + tidx
                if i < cute.size(x):
                    out[i] = (x[i].to(cutlass.Float32) * 2.0 + 1.0).to(cutlass.BFloat16)
    ''',
    "kernels/toy/family.py": '''
        import cutlass.cute as cute
        import torch

        from dsv4bench.core.registry import Cost, Family, Impl, Option, Tolerance, register_family, register_impl
        from dsv4bench.core.torch_impls import register_torch_baselines
        from kernels.common import compile_kernel, fake_rowmajor
        from kernels.toy.affine import AffineKernel
        from oracles.toy import affine, affine_lowprec
        from sweeps import toy as space


        class ToyFamily(Family):
            name = "toy"
            description = "test-only: out = 2x + 1 in bf16"
            tolerance = Tolerance(ratio=2.0, rel_l2=1e-2)
            space = space
            options = {"width": Option("n", "row width", "elements"), "rows": Option("m", "rows", "rows")}

            def make_inputs(self, case, gen, device):
                return {"x": torch.randn(case["m"], case["n"], generator=gen).bfloat16().to(device)}

            def oracle(self, case, inputs):
                return {"out": affine(inputs["x"])}

            def lowprec(self, case, inputs):
                return {"out": affine_lowprec(inputs["x"])}

            def alloc_outputs(self, case, device):
                return {"out": torch.empty(case["m"], case["n"], dtype=torch.bfloat16, device=device)}

            def cost(self, case):
                return Cost(flops=2.0 * case["m"] * case["n"], bytes=4.0 * case["m"] * case["n"])


        class ToyCuteDSL(Impl):
            family, name, backend, compiles = "toy", "cutedsl", "cutedsl", True

            def compile(self, case, arch):
                n = cute.sym_int()
                return compile_kernel(AffineKernel(), fake_rowmajor("bf16", (n,)), fake_rowmajor("bf16", (n,)),
                                      arch=arch)

            def run(self, case, inputs, out, compiled):
                compiled(inputs["x"].view(-1), out["out"].view(-1))
                return out


        register_family(ToyFamily())
        register_impl(ToyCuteDSL())
        register_torch_baselines("toy", affine_lowprec, lambda fn, case, inputs: {"out": fn(inputs["x"])})
    ''',
    "oracles/toy.py": '''
        import torch


        def affine(x):
            return x.double() * 2 + 1


        def affine_lowprec(x):
            return (x.float() * 2 + 1).to(x.dtype)
    ''',
    "sweeps/toy.py": '''
        from hypothesis import strategies as st

        from sweeps.common import draw


        def production():
            return [{"m": 3, "n": 4096}, {"m": 129, "n": 1000}]


        def extra(n, seed):
            return draw(st.builds(lambda m, w: {"m": m, "n": w}, st.integers(1, 40), st.integers(1, 3000)), n, seed)
    ''',
    "tests/toy/test_toy.py": '''
        from oracles.toy import affine


        def test_affine_of_zero_is_one():
            import torch

            assert float(affine(torch.zeros(1))[0]) == 1.0
    ''',
}


@pytest.fixture(scope="module")
def toy_tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("toyfamily")
    for rel, text in FILES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    # the repository first (its regular packages), then the new family's directories join them
    env = cli_env(PYTHONPATH=os.pathsep.join([str(ROOT), str(root)]))
    env.pop("DSV4BENCH_PLUGINS", None)
    return root, env


def run(env, *args, timeout=600):
    res = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=timeout)
    print(res.stdout[-3000:], res.stderr[-3000:])
    return res


def test_the_toy_family_is_listed_swept_replayed_and_conforms(toy_tree):
    root, env = toy_tree
    assert not (ROOT / "kernels" / "toy").exists(), "the toy family must live outside the repository"

    listed = run(env, "-m", "dsv4bench", "list")
    assert listed.returncode == 0 and "toy" in listed.stdout and "test-only: out = 2x + 1" in listed.stdout

    helped = run(env, "-m", "dsv4bench", "sweep", "toy", "--help")
    assert helped.returncode == 0 and "--width" in helped.stdout and "row width" in helped.stdout
    assert "--hd" not in helped.stdout  # only its own shape options

    out = root / "run"
    swept = run(env, "-m", "dsv4bench", "sweep", "toy", "--compile-only", "--cpu-check", "--examples", "2", "--out", str(out))
    assert swept.returncode == 0, swept.stdout
    recs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    compiled = {(r["arch"], r["status"]) for r in recs if r["impl"] == "cutedsl"}
    assert compiled == {("sm_90a", "COMPILED"), ("sm_100a", "COMPILED")}
    assert {r["status"] for r in recs if r["mode"] == "check"} == {"PASS"}

    case_id = recs[0]["case_id"]
    replayed = run(env, "-m", "dsv4bench", "repro", case_id, "--runs", str(out))
    assert replayed.returncode == 0 and "COMPILED" in replayed.stdout

    conforms = run(env, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(ROOT / "tests" / "conformance"),
                   "-k", "toy", str(root / "tests" / "toy"))
    assert conforms.returncode == 0
    passed = int(conforms.stdout.strip().splitlines()[-1].split(" passed")[0].split()[-1])
    assert passed >= 1 + 4 + 2 + 1  # declaration, CPU checks, a compile per arch, its own test
