"""A test-only family whose compile step misbehaves on purpose (loaded via DSV4BENCH_PLUGINS).

behaviour=ok     compiles instantly
behaviour=slow   takes `seconds` to compile (for interrupt/resume tests)
behaviour=hang   never returns, after forking a child that never exits either (the child writes
                 its pid to $FAULTY_PID_DIR so a test can check it was killed with the group)
behaviour=crash  the process dies (like a segfaulting compiler)
"""

from __future__ import annotations

import os
import time

import torch

from dsv4bench.core.case import Case
from dsv4bench.core.registry import Cost, Family, Impl, register_family, register_impl

BEHAVIOURS = ["ok", "hang", "crash", "ok"]


class FaultyFamily(Family):
    name = "faulty"
    description = "test family with planted hangs and crashes"

    def cases(self, opts):
        behaviours = os.environ.get("FAULTY_BEHAVIOURS", ",".join(BEHAVIOURS)).split(",")
        return [Case(self.name, {"i": i, "behaviour": b, "seconds": float(os.environ.get("FAULTY_SECONDS", "0"))},
                     opts.seed) for i, b in enumerate(behaviours)]

    def make_inputs(self, case, gen, device):
        return {"x": torch.randn(4, 8, generator=gen).to(device)}

    def oracle(self, case, inputs):
        return {"out": inputs["x"].float() * 2}

    def lowprec(self, case, inputs):
        return {"out": (inputs["x"].bfloat16() * 2).float()}

    def alloc_outputs(self, case, device):
        return {"out": torch.empty(4, 8, device=device)}

    def cost(self, case):
        return Cost(32, 256)


class FaultyCompile(Impl):
    family, name, backend, compiles = "faulty", "kernel", "cutedsl", True

    def compile_key(self, case, arch):
        return (self.name, arch, case["i"], case["behaviour"])

    def compile(self, case, arch):
        behaviour = case["behaviour"]
        if behaviour == "slow":
            time.sleep(case["seconds"])
        elif behaviour == "hang":
            if os.fork() == 0:  # a child of the hung compiler, in the same process group
                with open(os.path.join(os.environ["FAULTY_PID_DIR"], f"child-{os.getpid()}"), "w") as f:
                    f.write(str(os.getpid()))
                while True:
                    time.sleep(1)
            while True:
                time.sleep(1)
        elif behaviour == "crash":
            os._exit(11)
        return object()

    def run(self, case, inputs, out, compiled):
        out["out"].copy_(inputs["x"] * 2)
        return out


class FaultyTorch(Impl):
    family, name, backend, needs_gpu = "faulty", "torch", "torch", False

    def run(self, case, inputs, out, compiled):
        return {"out": (inputs["x"].bfloat16() * 2).float()}


register_family(FaultyFamily())
register_impl(FaultyCompile())
register_impl(FaultyTorch())
