"""Bad input gets one clear line and exit status 2, never a traceback."""

from __future__ import annotations

import pytest

from tests.core.helpers import dsv4bench


@pytest.mark.parametrize("args, message", [
    (["sweep", "nosuchkernel"], "unknown kernel family 'nosuchkernel'"),
    (["sweep", "rmsnorm", "--width", "64,abc"], "--width needs a comma-separated list of integers"),
    (["sweep", "rmsnorm", "--hd", "64,128"], "option --hd does not apply to rmsnorm"),
    (["sweep", "fmha", "--hd", "64,abc"], "--hd needs a comma-separated list of integers"),
    (["sweep", "fmha", "--hd", "96"], "--hd takes 64, 128, 256, 512"),
    (["sweep", "rmsnorm", "--arch", "sm_80"], "unsupported arch 'sm_80'"),
    (["sweep", "rmsnorm", "--shard", "3/2"], "--shard i/n needs 0 <= i < n"),
    (["repro", "rmsnor-0000000000", "--runs", "/nonexistent"], "not found in any run directory"),
])
def test_bad_input_is_one_line_exit_2(args, message):
    res = dsv4bench(*args)
    out = (res.stdout + res.stderr).strip()
    assert res.returncode == 2, out
    assert message in out
    assert "Traceback" not in out
    assert len(out.splitlines()) == 1, out


def test_unwritable_out_is_one_line_exit_2(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    res = dsv4bench("sweep", "rmsnorm", "--out", str(blocker / "run"))
    out = (res.stdout + res.stderr).strip()
    assert res.returncode == 2 and "cannot write to --out" in out and len(out.splitlines()) == 1, out


def test_error_text_with_brackets_and_long_lines_stays_literal_and_on_one_line():
    res = dsv4bench("sweep", "rmsnorm", "--width", "[hosts.a]" + "9" * 200)
    out = (res.stdout + res.stderr).strip()
    assert res.returncode == 2 and "[hosts.a]" in out and len(out.splitlines()) == 1, out


def test_an_unknown_impl_of_a_family_that_loaded_in_part_says_why(monkeypatch):
    """A variants module that raised after its family registered leaves its impls unregistered: the unknown-impl
    error names the import failure instead of only listing the impls that did load."""
    from dsv4bench.core import registry

    registry.load_families()
    module = registry.family_packages()["rmsnorm"]
    monkeypatch.setitem(registry.BROKEN_MODULES, module, "SyntaxError: '(' was never closed (variants.py, line 1)")
    with pytest.raises(KeyError, match=r"loaded only in part: .*SyntaxError"):
        registry.get_impl("rmsnorm", "cutedsl:nosuchvariant")
    monkeypatch.delitem(registry.BROKEN_MODULES, module)
    with pytest.raises(KeyError) as err:
        registry.get_impl("rmsnorm", "cutedsl:nosuchvariant")
    assert "loaded only in part" not in str(err.value)


def test_every_family_package_imports_whole():
    """No family module fails to import on the CPU (a module raising after its family registered would otherwise
    only show as missing variants, or fail each compile on the device)."""
    from dsv4bench.core import registry

    registry.load_families()
    assert registry.BROKEN_MODULES == {}
