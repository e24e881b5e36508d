"""The slow tier's list names tests that exist, and regenerating it from a JUnit report follows its rule."""

from __future__ import annotations

import ast

from support.slow_tier import ROOT, listed, node_id, slow_ids


def test_every_listed_test_exists():
    missing = []
    for nid in listed():
        path, *names = nid.split("::")
        file = ROOT / path
        if not file.exists():
            missing.append(nid)
            continue
        defined = {
            n.name for n in ast.walk(ast.parse(file.read_text())) if isinstance(n, (ast.FunctionDef, ast.ClassDef))
        }
        if any(name.split("[")[0] not in defined for name in names):
            missing.append(nid)
    assert missing == [], "tests/slow_tests.txt names tests that do not exist (regenerate it, see its header)"


def test_the_list_is_sorted_and_has_no_duplicates():
    ids = listed()
    assert ids == sorted(set(ids))


def test_a_junit_class_maps_to_its_node_id():
    assert node_id("tests.unit.test_slow_tier", "test_x[a-b]") == "tests/unit/test_slow_tier.py::test_x[a-b]"
    assert node_id("tests.unit.test_slow_tier.TestX", "test_y") == "tests/unit/test_slow_tier.py::TestX::test_y"


def test_regenerating_keeps_what_the_report_cannot_judge():
    times = {"a.py::fast": (1.0, True), "a.py::slow": (12.0, True), "a.py::failed": (0.5, False)}
    before = ["a.py::failed", "a.py::fast", "a.py::not_run"]
    # fast leaves the tier, slow joins it, the failed and the unreported tests keep their place
    assert slow_ids(times, before, 10.0) == ["a.py::failed", "a.py::not_run", "a.py::slow"]
