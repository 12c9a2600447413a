"""`dsv4bench layouts` traces a shape the production grid lacks (no GPU needed)."""

from __future__ import annotations

from tests.core.helpers import dsv4bench


def test_layouts_of_a_width_outside_the_grid():
    res = dsv4bench("layouts", "rmsnorm", "--width", "4416")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "n=4416" in res.stdout
    # two 8-element vectors per thread at 512 threads per row (the second cut off past column
    # 4416): the partition the lint guards
    assert "((8,2),1,1):((1,4096),0,0)" in res.stdout
    assert "lints: none" in res.stdout
