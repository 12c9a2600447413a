"""`make-checkpoint` and `run-model` through typer, as the root app will register them."""

import json
import re

import pytest
import typer
from typer.testing import CliRunner

from dsv4bench.cli.common import UsageProblem
from dsv4bench.cli.model import register
from dsv4bench.model.config import TINY
from dsv4bench.model.loader import Checkpoint

app = typer.Typer()
register(app)


@app.callback()
def _root():
    pass


runner = CliRunner()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DSV4BENCH_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def run(*args):
    return runner.invoke(app, list(args))


def generated(output: str) -> str:
    return output.splitlines()[1]  # line 0 is the header, line 1 the prompt and the stream


def test_run_model_embedded_default(cache):
    r = run("run-model", "--prompt", "Hello", "--max-new-tokens", "24", "--seed", "5")
    assert r.exit_code == 0, r.output
    assert (cache / "tiny-ckpt-v2" / "config.json").is_file()
    assert "byte-level fallback tokenizer" in r.output and generated(r.output).startswith("Hello")
    assert re.search(r"decode\s*│\s*[\d.]+ tokens/s", r.output)
    for op in ("sparse_attention", "moe", "indexer_topk", "compressor_push", "lm_head"):
        assert re.search(rf"{op}\s*│ oracle\s*│\s*[1-9]", r.output), op
    again = run("run-model", "--prompt", "Hello", "--max-new-tokens", "24", "--seed", "5")
    other = run("run-model", "--prompt", "Hello", "--max-new-tokens", "24", "--seed", "6")
    assert generated(again.output) == generated(r.output) != generated(other.output)


def test_make_checkpoint_then_run_it(tmp_path):
    out = tmp_path / "ck"
    r = run("make-checkpoint", "--config", "tiny", "--out", str(out), "--seed", "3")
    assert r.exit_code == 0, r.output
    assert f"{len(Checkpoint.open(out).tensors):,}" in r.output
    assert json.loads((out / "config.json").read_text())["hidden_size"] == TINY.dim
    r = run("run-model", "--prompt", "abc", "--checkpoint", str(out), "--max-new-tokens", "3", "--temperature", "0")
    assert r.exit_code == 0, r.output
    assert re.search(r"new tokens\s*│ 3 ", r.output)


def test_tokenizer_json_is_used_when_present(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    out = tmp_path / "ck"
    assert run("make-checkpoint", "--config", "tiny", "--out", str(out)).exit_code == 0
    vocab = {"[UNK]": 2, "hello": 10, "world": 11}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(out / "tokenizer.json"))
    r = run("run-model", "--prompt", "hello world", "--checkpoint", str(out), "--max-new-tokens", "2")
    assert r.exit_code == 0, r.output
    assert "tokenizer.json tokenizer · 3 prompt tokens" in r.output


@pytest.mark.parametrize("args, message", [
    (("run-model", "--prompt", "x", "--config", "huge"), "unknown config 'huge'"),
    (("run-model", "--prompt", "x", "--config", "flash"), "GiB of weights do not fit in 80% of this machine's"),
    (("run-model", "--prompt", "x", "--checkpoint", "/nonexistent/ck"), "checkpoint directory /nonexistent/ck does not exist"),
    (("run-model", "--prompt", "x", "--device", "tpu"), "unknown --device 'tpu'"),
    (("run-model", "--prompt", "x", "--temperature", "-1"), "--temperature must be >= 0"),
    (("run-model", "--prompt", "x", "--max-new-tokens", "5000"), "exceed max_position_embeddings=4096"),
    (("run-model", "--prompt", "x", "--backend", "nokernel"), "no op has a backend 'nokernel'"),
    (("run-model", "--prompt", "x", "--qat", "maybe"), "unknown --qat 'maybe'; choose on or off"),
    (("run-model", "--prompt", "x", "--bisect"), "--bisect needs a --backend to bisect"),
    (("run-model", "--prompt", "x", "--prompt", "y", "--compare"), "--compare and --bisect take one --prompt"),
    (("run-model", "--prompt", "x", "--bisect", "--backend", "cutedsl"), "no op runs on 'cutedsl' here"),
    (("make-checkpoint", "--config", "huge", "--out", "/tmp/x"), "unknown config 'huge'"),
])
def test_bad_input_is_one_clear_usage_problem(cache, args, message):
    r = run(*args)
    assert isinstance(r.exception, UsageProblem), r.output
    assert message in str(r.exception) and "\n" not in str(r.exception)


def _cell(output: str, *row: str) -> list[str]:
    """The cells after the leading cells `row` of the last table row that starts with them."""
    lead = r"\s*│\s*".join(re.escape(c) for c in row)
    line = [ln for ln in output.splitlines() if re.match(rf"│\s*{lead}\s*│", ln)][-1]
    return [c.strip() for c in line.split("│")[1:-1]][len(row):]


def test_compare_reports_per_layer_and_op(cache):
    from dsv4bench.model.dispatch import register_op
    from oracles.norm import rmsnorm

    register_op("rmsnorm", "cli-noisy", lambda x, w=None, eps=1e-6: rmsnorm(x, w, eps) * 1.02)
    same = run("run-model", "--prompt", "Hi", "--max-new-tokens", "6", "--compare")
    noisy = run("run-model", "--prompt", "Hi", "--max-new-tokens", "6", "--compare", "--backend", "cli-noisy")
    assert same.exit_code == 0 and noisy.exit_code == 0, noisy.output
    assert _cell(same.output, "layer 2 ffn", "moe") == ["oracle", "6", "0.00e+00", ""]
    assert _cell(same.output, "top-1 agreement") == ["100.00%"] and "the same 6 tokens" in same.output
    assert _cell(noisy.output, "layer 0 attn", "rmsnorm")[:4] == ["cli-noisy", "6", "2.00e-02", "2.00e-02"]
    assert _cell(noisy.output, "layer 0 attn", "hc_pre") == ["oracle", "6", "0.00e+00", ""]
    assert float(_cell(noisy.output, "layer 3", )[1]) > 1e-3  # the residual stream after layer 3
    low_attn, low_layer, verdict = _cell(noisy.output, "layer 3")[2:]  # the low-precision model beside it
    assert 0 < float(low_layer) < float(_cell(noisy.output, "layer 3")[1]) and verdict.startswith("no (")
    assert re.search(r"top-1 agreement\s*│ [\d.]+% \(lowprec [\d.]+%\)", noisy.output)
    assert "lowprec" not in same.output  # the oracle backend has no bound beside it
    assert re.search(r"rmsnorm\s*│ cli-noisy", noisy.output)  # and the run itself used it


def test_bisect_names_the_op_that_jumps(cache):
    from dsv4bench.model.dispatch import OPS, register_op

    register_op("hc_pre", "cli-bisect", OPS["hc_pre"].oracle)
    register_op("moe", "cli-bisect", lambda *a, **k: OPS["moe"].oracle(*a, **k) * 1.05)
    r = run("run-model", "--prompt", "Hi", "--max-new-tokens", "4", "--bisect", "--backend", "cli-bisect")
    assert r.exit_code == 0, r.output
    assert _cell(r.output, "hc_pre")[0] == "0.00e+00" and _cell(r.output, "hc_pre")[2:] == ["-", "0.00e+00", ""]
    assert _cell(r.output, "moe")[0] == "5.00e-02" and _cell(r.output, "moe")[-1] == "jumps"
    assert "first op whose error jumps (> 10x its bf16 floor): moe" in r.output


def test_a_batch_of_prompts_gets_what_each_gets_alone(cache):
    args = ("--max-new-tokens", "5", "--temperature", "0.8", "--seed", "3")
    batch = run("run-model", "--prompt", "Hello there", "--prompt", "Hi", *args)
    assert batch.exit_code == 0, batch.output
    assert "12, 3 prompt tokens" in batch.output and _cell(batch.output, "new tokens") == ["5, 5"]
    for i, prompt in enumerate(("Hello there", "Hi")):
        alone = generated(run("run-model", "--prompt", prompt, *args).output)
        assert f"[{i}] {alone}" in batch.output.splitlines()


def test_qat_is_on_by_default_and_can_be_switched_off(cache):
    on = run("run-model", "--prompt", "Hi", "--max-new-tokens", "2")
    off = run("run-model", "--prompt", "Hi", "--max-new-tokens", "2", "--qat", "off")
    assert "qat on" in on.output.splitlines()[0] and "qat off" in off.output.splitlines()[0]
