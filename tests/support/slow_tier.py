"""The slow tier: tests that take 7 s or more each on the 2-core CI machine, listed in ``tests/slow_tests.txt``.

``.ci/run`` runs the suite in two passes, ``-m "not slow"`` (the main pass, for a quick answer) and then
``-m slow``; both must pass. ``pytest`` without ``-m`` runs everything. The list is measured, not chosen: after a
full run with ``--junitxml=FILE``, regenerate it with

    python tests/support/slow_tier.py FILE [--seconds 10]

A listed test that no longer exists fails ``tests/unit/test_slow_tier.py``.
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIST = ROOT / "tests" / "slow_tests.txt"
THRESHOLD_SECONDS = 7.0

HEADER = """\
# The slow tier (tests/support/slow_tier.py): tests measured at {seconds:g} s or more each on the 2-core machine.
# .ci/run runs them in a second pass (-m slow) after the main pass (-m "not slow"). Regenerate, don't edit:
#   python -m pytest --junitxml=/tmp/junit.xml && python tests/support/slow_tier.py /tmp/junit.xml
"""


def listed(path: Path = LIST) -> list[str]:
    """The node ids in the list, in order."""
    if not path.exists():
        return []
    return [s for line in path.read_text().splitlines() if (s := line.strip()) and not s.startswith("#")]


def node_id(classname: str, name: str) -> str:
    """pytest's node id of a JUnit test case: class ``tests.<dir>.test_<name>`` and name ``test_<case>`` become
    ``tests/<dir>/test_<name>.py::test_<case>`` (a test class's name stays after the file)."""
    parts = classname.split(".")
    for k in range(len(parts), 0, -1):
        path = "/".join(parts[:k]) + ".py"
        if (ROOT / path).exists():
            return "::".join([path, *parts[k:], name])
    raise ValueError(f"no test file for JUnit class {classname!r}")


def report(junit: Path) -> dict[str, tuple[float, bool]]:
    """Node id -> (seconds with setup and teardown, whether it passed) for every test case of a JUnit report."""
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        if not case.get("classname"):  # a module skipped at collection
            continue
        passed = not any(child.tag in ("failure", "error", "skipped") for child in case)
        out[node_id(case.get("classname", ""), case.get("name", ""))] = (float(case.get("time", 0)), passed)
    return out


def slow_ids(times: dict[str, tuple[float, bool]], before: list[str], seconds: float) -> list[str]:
    """The new list: a test that passed in the report is slow when it took ``seconds`` or more; one that the report
    does not have, or that failed there (its time says nothing), keeps its place."""
    keep = {i for i in before if i not in times or not times[i][1]}
    return sorted(keep | {i for i, (t, passed) in times.items() if passed and t >= seconds})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit", type=Path, help="the JUnit XML report of a run (pytest --junitxml)")
    parser.add_argument("--seconds", type=float, default=THRESHOLD_SECONDS)
    args = parser.parse_args()
    ids = slow_ids(report(args.junit), listed(), args.seconds)
    LIST.write_text(HEADER.format(seconds=args.seconds) + "".join(f"{i}\n" for i in ids))
    print(f"{LIST.relative_to(ROOT)}: {len(ids)} tests")


if __name__ == "__main__":
    main()
