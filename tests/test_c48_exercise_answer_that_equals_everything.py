"""C48: an exercise answer that equals everything.

``check`` compared the learner's value with ``got == want``, so the learner's object decided: one whose
``__eq__`` always returns True passed every value, and ``True`` passed a count of 1. Values now compare
by type and content (``agentlab.course.exercises.values.same``), and a FAILED line shows the value given
and the one expected, each with its type.
"""

from __future__ import annotations

import collections

import numpy
import pytest

from agentlab.course.exercises import check
from agentlab.course.exercises.values import described, same, shown

KEYS = ("refund_rows", "provider_refunds", "second_call")


class EqualsEverything:
    """A value equal to anything, hashed like anything asked: what C48's learner returned."""

    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    def __hash__(self):
        return 0


class LyingDict(dict):
    def __eq__(self, other):
        return True

    __hash__ = None


class LyingStr(str):
    def __eq__(self, other):
        return True

    __hash__ = str.__hash__


class LyingKey(str):
    """A key that claims to be every key: ``"refund_rows" in {LyingKey("x"): 1}`` could be fooled."""

    def __eq__(self, other):
        return True

    def __hash__(self):
        return hash("refund_rows")


class ReprRaises:
    def __repr__(self):
        raise RuntimeError("no repr for you")


def lines(capsys) -> list[str]:
    return [line.strip() for line in capsys.readouterr().out.splitlines()]


async def test_c48_an_object_equal_to_everything_fails_every_value_with_the_expected_value_and_type(capsys):
    async def cheat(h, preset_name) -> dict:
        return {key: EqualsEverything() for key in KEYS}

    assert not await check("2.1", cheat)
    out = lines(capsys)
    failed = [line for line in out if line.startswith("FAILED: ")]
    assert len(failed) == 6 and not any(line.startswith("passed: ") for line in out)
    assert failed[0].startswith("FAILED: refund_rows = <")
    assert "EqualsEverything object at 0x" in failed[0] and ", expected 2 (int); hint: " in failed[0]
    assert ", expected 'applied' (str); hint: " in failed[2] and ", expected 'failed' (str); hint: " in failed[5]


async def test_c48_a_bool_is_not_a_count_and_a_str_subclass_is_not_a_str(capsys):
    async def bools(h, preset_name) -> dict:
        one = preset_name == "constraints"
        return {"refund_rows": True if one else 2, "provider_refunds": numpy.int64(1 if one else 2),
                "second_call": LyingStr("failed" if one else "applied")}

    assert not await check("2.1", bools)
    out = lines(capsys)
    assert "passed: provider_refunds = 1" in out  # a NumPy integer is the number it holds
    assert any(line.startswith("FAILED: refund_rows = True (bool), expected 1 (int); hint: ") for line in out)
    assert any(line.startswith("FAILED: second_call = 'failed' (LyingStr), expected 'failed' (str); ") for line in out)


async def test_c48_a_dict_subclass_with_a_lying_eq_is_read_as_the_dict_it_holds(capsys):
    """A nested dict compares by its items, read through ``dict``'s own methods: a subclass's ``__eq__``
    (always True) is not asked, and a Counter with the right items still passes."""
    async def lying(h, preset_name) -> dict:
        return LyingDict(refund_rows=LyingDict(n=2), provider_refunds=collections.Counter(n=2),
                         second_call="applied")

    assert not await check("2.1", lying)
    out = lines(capsys)
    assert any(line.startswith("FAILED: refund_rows = {'n': 2} (LyingDict), expected 2 (int)") for line in out)
    assert same(collections.Counter(n=2), {"n": 2}) and same(LyingDict(n=2), {"n": 2})
    assert not same(LyingDict(n=3), {"n": 2}) and not same(LyingDict(n=2, m=1), {"n": 2})


async def test_c48_a_key_that_equals_every_key_and_a_repr_that_raises_do_not_pass_or_crash_the_check(capsys):
    async def tricky(h, preset_name) -> dict:
        return {LyingKey("whatever"): 2, "provider_refunds": ReprRaises(), "second_call": "applied"}

    assert not await check("2.1", tricky)
    out = lines(capsys)
    assert out[1].startswith("FAILED: refund_rows missing, expected 2 (int); hint: ")
    assert out[2].startswith("FAILED: provider_refunds = <a ReprRaises whose repr raised>, expected 2")
    assert out[3] == "passed: second_call = 'applied'"


@pytest.mark.parametrize("got, want", [
    (EqualsEverything(), 1), (EqualsEverything(), None), (EqualsEverything(), [1]), (EqualsEverything(), {"a": 1}),
    (True, 1), (False, 0), (1, True), (1.0, 1), (1, 1.0), ("1", 1), (LyingStr("x"), "x"), (b"x", "x"),
    (float("nan"), 0.0), (float("nan"), 1), (0.0, float("nan")), (numpy.float64("nan"), 2.5),
    ([1, 2], (1, 2)), ((1, 2), [1, 2]), ([1, 2], [1, 2, 3]), ([1, EqualsEverything()], [1, 2]),
    ({"a": 1}, {"a": 1, "b": 2}), ({"a": True}, {"a": 1}), (LyingDict(), {"a": 1}), (None, 0), (0, None),
    (numpy.bool_(True), 1), ({EqualsEverything(): 1}, {"a": 1}),
])
def test_c48_values_of_another_type_or_content_are_not_the_same(got, want):
    assert not same(got, want)


@pytest.mark.parametrize("got, want", [
    (1, 1), (True, True), (None, None), ("applied", "applied"), (0.1 + 0.2, 0.3), (float("nan"), float("nan")),
    (numpy.int64(3), 3), (numpy.float64(2.5), 2.5), (numpy.bool_(False), False), ([1, [2, "x"]], [1, [2, "x"]]),
    ((1, None), (1, None)), ({"a": [1, {"b": 2.0}]}, {"a": [1, {"b": 2.0}]}),
    (collections.defaultdict(int, a=1), {"a": 1}), ([], []),
])
def test_c48_values_of_the_same_type_and_content_are_the_same(got, want):
    assert same(got, want)


class TwoLines:
    def __repr__(self):
        return "first\nsecond"


class ReprNotStr:
    def __repr__(self):
        return 3


def test_c48_a_failed_line_can_show_any_value():
    assert described(True) == "True (bool)" and described(numpy.int64(3)) == "3 (int)"
    assert shown(TwoLines()) == "first second"
    assert described(ReprRaises()) == "<a ReprRaises whose repr raised>"
    assert shown(ReprNotStr()) == "<a ReprNotStr whose repr raised>"
