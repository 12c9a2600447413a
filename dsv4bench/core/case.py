"""Case: a frozen record of parameters plus a seed, with a stable short id.

The id is a hash of (family, params, seed), so the same case always gets the same id on every
machine and `dsv4bench repro ID` can find and replay it from a run directory.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Mapping


def _canonical(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {str(k): _canonical(v) for k, v in sorted(obj.items())}
    if isinstance(obj, (list, tuple)):
        return [_canonical(v) for v in obj]
    return obj


@dataclass(frozen=True)
class Case:
    family: str
    params: Mapping[str, Any]
    seed: int = 0
    origin: str = field(default="grid", compare=False)  # grid | hypothesis | regression | cli

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", _canonical(dict(self.params)))

    @property
    def id(self) -> str:
        blob = json.dumps(
            {"family": self.family, "params": self.params, "seed": self.seed}, sort_keys=True
        )
        return self.family[:6] + "-" + hashlib.sha1(blob.encode()).hexdigest()[:10]

    def __getitem__(self, key: str) -> Any:
        return self.params[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.params.get(key, default)

    def shape_str(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.params.items())

    def to_json(self) -> dict:
        return {"family": self.family, "params": self.params, "seed": self.seed, "origin": self.origin}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Case":
        return cls(d["family"], d["params"], int(d.get("seed", 0)), d.get("origin", "grid"))

    def __str__(self) -> str:
        return f"{self.id} [{self.family}] {self.shape_str()} seed={self.seed}"
