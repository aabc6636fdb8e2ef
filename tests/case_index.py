"""The index of cases: which tests hold each case of the project's case list (C01, C02, ...).

    python tests/case_index.py           # prints the index (markdown)

A test holds a case when it is named after it (``test_c25_...``, or lives in a file named so) or carries
``@pytest.mark.case("C25")``. ``tests/test_case_index.py`` checks that ``tests/CASES.md`` is this index.
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent
MARKER = re.compile(r"""@pytest\.mark\.case\(\s*["'](C\d\d)["']\s*\)\s*\n(?:@.*\n)*\s*(?:async\s+)?def\s+(test_\w+)""")
NAMED = re.compile(r"^(?:async\s+)?def\s+(test_c(\d\d)_\w+)", re.M)


def index() -> dict[str, list[str]]:
    """Case id -> sorted ``path::test`` entries (paths relative to ``tests/``)."""
    found: dict[str, set[str]] = defaultdict(set)
    for path in sorted(TESTS.rglob("test_*.py")):
        rel = path.relative_to(TESTS).as_posix()
        text = path.read_text()
        file_case = re.match(r"test_c(\d\d)_", path.name)
        for name, number in NAMED.findall(text):
            found[f"C{number}"].add(f"{rel}::{name}")
        for case, name in MARKER.findall(text):
            found[case].add(f"{rel}::{name}")
        if file_case:
            for name in re.findall(r"^(?:async\s+)?def\s+(test_\w+)", text, re.M):
                found[f"C{file_case.group(1)}"].add(f"{rel}::{name}")
    return {case: sorted(tests) for case, tests in sorted(found.items())}


def render() -> str:
    lines = ["# Cases and the tests that hold them", "",
             "Made by `python tests/case_index.py > tests/CASES.md`; `tests/test_case_index.py` keeps it current.", ""]
    for case, tests in index().items():
        lines.append(f"- **{case}**: " + ", ".join(f"`{t}`" for t in tests))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
