"""docs/model.md documents every op of the dispatch table with its oracle."""

import re
from pathlib import Path

from dsv4bench.model.dispatch import OPS

DOC = Path(__file__).resolve().parents[2] / "docs" / "model.md"


def test_every_op_is_documented_with_its_oracle():
    rows = dict(re.findall(r"^\| `(\w+)` \| `([\w.]+)` \|", DOC.read_text(), flags=re.M))
    want = {name: f"{info.oracle.__module__}.{info.oracle.__name__}" for name, info in OPS.items()}
    assert rows == want
