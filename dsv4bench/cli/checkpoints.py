"""Which checkpoint a model command opens: a directory, the embedded tiny one, or a production-width
synthetic one drawn on the device after a memory check (run-model and bench-model alike)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from dsv4bench.cli.common import console, fail


def resolve_checkpoint(checkpoint: Optional[Path], config: Optional[str]) -> Path | None:
    """The checkpoint directory to open, or None for a synthetic (flash / pro) checkpoint."""
    from dsv4bench.model.config import CONFIGS

    if checkpoint is not None:
        if config is not None:
            fail("pass either --checkpoint or --config, not both")
        return checkpoint
    name = config or "tiny"
    if name not in CONFIGS:
        fail(f"unknown config {name!r}; choose one of {', '.join(CONFIGS)}")
    if name != "tiny":
        return None
    from dsv4bench.model.default import cache_dir, default_checkpoint

    with console.status(f"embedded tiny checkpoint ({cache_dir()})"):
        return default_checkpoint()


def synthetic_checkpoint(config: str, layers: Optional[int], weights_seed: int, device: str):
    """The production-width checkpoint drawn on `device`, after a check that it fits there."""
    import torch

    from dsv4bench.model.config import ConfigError, get_config
    from dsv4bench.model.synthetic import SyntheticCheckpoint

    cfg = get_config(config)
    try:
        cfg = cfg.truncated(layers) if layers is not None else cfg
    except ConfigError as e:
        fail(str(e))
    ckpt = SyntheticCheckpoint(cfg, weights_seed)
    need = ckpt.nbytes()
    if device == "cuda":
        free, where = torch.cuda.mem_get_info()[0], "the GPU's"
    else:
        free, where = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "this machine's"
    if need > 0.8 * free:  # the rest: activations, caches and the oracles' dequantised weights
        fail(f"--config {config} --layers {cfg.n_layers}: {need / 2**30:.1f} GiB of weights do not fit in "
             f"80% of {where} {free / 2**30:.1f} GiB free; pass fewer --layers")
    return ckpt
