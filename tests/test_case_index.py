"""The index of cases (``tests/CASES.md``) lists, for each case, the tests that hold it, and is current."""

from __future__ import annotations

from case_index import TESTS, index, render

from conftest import case_of


def test_the_case_index_is_current():
    assert (TESTS / "CASES.md").read_text() == render(), "run: python tests/case_index.py > tests/CASES.md"


def test_every_case_named_in_a_test_has_an_entry_and_ids_are_well_formed():
    cases = index()
    assert len(cases) >= 40 and all(len(c) == 3 and c[0] == "C" for c in cases)
    assert case_of("test_c25_replay", "test_x.py") == "C25" and case_of("test_x", "test_c07_y.py") == "C07"
    assert case_of("test_plain", "test_plain.py") is None
