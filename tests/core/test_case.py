from dsv4bench.core.case import Case


def test_case_id_is_stable_and_order_free():
    a = Case("rmsnorm", {"m": 3, "n": 512, "dtype": "bf16"}, 7)
    b = Case("rmsnorm", {"dtype": "bf16", "n": 512, "m": 3}, 7)
    assert a.id == b.id == "rmsnor-" + a.id.split("-")[1]
    assert Case("rmsnorm", {"m": 3, "n": 512, "dtype": "bf16"}, 8).id != a.id
    assert Case.from_json(a.to_json()).id == a.id
    assert "m=3" in str(a) and "seed=7" in str(a)
