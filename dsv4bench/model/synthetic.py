"""A checkpoint that is never written: each load unit is drawn on the device that loads it, in the
official formats (FP8 linears with ue8m0 block scales, MXFP4 experts, bf16 / fp32 rest) by the rules of
`dsv4bench.model.synth`, deterministic per seed. It gives the production widths on one GPU without
a multi-gigabyte file: `run-model --config flash --layers 4 --device cuda`."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsv4bench.model.config import ModelConfig
from dsv4bench.model.inventory import expected_tensors, group_tensors, groups
from dsv4bench.model.synth import make_tensor


@dataclass(frozen=True)
class SyntheticCheckpoint:
    config: ModelConfig
    seed: int = 0

    def load_group(self, group: str, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
        """The tensors of one load unit ("top", "layers.i", "mtp.k"), drawn on `device`."""
        if group not in groups(self.config):
            raise KeyError(f"no load unit {group!r} in the synthetic {self.config.name} checkpoint")
        specs = group_tensors(self.config, group)
        return {name: make_tensor(name, spec, specs, self.seed, device) for name, spec in specs.items()}

    def nbytes(self) -> int:
        """Bytes of every tensor, as stored."""
        return sum(spec.nbytes for spec in expected_tensors(self.config).values())
