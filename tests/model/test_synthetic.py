"""The synthetic checkpoint (dsv4bench/model/synthetic.py): the same tensors as the written one, the
truncated configs, and run-model's checks around them."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from dsv4bench.cli.common import UsageProblem
from dsv4bench.cli.main import app
from dsv4bench.model.config import FLASH, PRO, TINY, ConfigError
from dsv4bench.model.inventory import groups
from dsv4bench.model.loader import Checkpoint
from dsv4bench.model.synth import write_checkpoint
from dsv4bench.model.synthetic import SyntheticCheckpoint


def test_drawn_tensors_equal_the_written_checkpoints(tmp_path):
    seed = int(torch.randint(1000, ()))
    written = Checkpoint.open(write_checkpoint(TINY, tmp_path, seed=seed))
    drawn = SyntheticCheckpoint(written.config, seed)
    for group in groups(TINY):
        a, b = written.load_group(group), drawn.load_group(group)
        assert a.keys() == b.keys(), group
        for name in a:
            assert a[name].dtype == b[name].dtype and torch.equal(a[name].view(torch.uint8), b[name].view(torch.uint8)), name
    with pytest.raises(KeyError, match="layers.99"):
        drawn.load_group("layers.99")


def test_truncated_configs_keep_every_layer_kind():
    flash4 = FLASH.truncated(4)
    assert flash4.compress_ratios == (0, 0, 4, 128, 0)  # SWA, SWA, CSA, HCA + the MTP block's
    assert flash4.n_hash_layers == 3 and [flash4.is_hash(i) for i in range(4)] == [True, True, True, False]
    assert PRO.truncated(2).compress_ratios == PRO.compress_ratios[:2] + PRO.compress_ratios[PRO.n_layers:]
    assert FLASH.truncated(FLASH.n_layers) == FLASH
    for bad in (0, FLASH.n_layers + 1):
        with pytest.raises(ConfigError, match="--layers"):
            FLASH.truncated(bad)
    assert 19e9 < SyntheticCheckpoint(flash4).nbytes() < 21e9  # MXFP4 experts dominate: 3.2 GB a layer


@pytest.mark.parametrize("args,message", [
    (["--config", "flash", "--layers", "0"], "--layers 0: flash has 1..43 layers"),
    (["--layers", "2"], "--layers takes --config flash or pro"),
    (["--config", "flash", "--weights-seed", "-1"], "--weights-seed"),
])
def test_run_model_refuses_bad_synthetic_options(args, message):
    result = CliRunner().invoke(app, ["run-model", "--prompt", "hi", *args])
    assert isinstance(result.exception, UsageProblem) and message in str(result.exception), result.output
