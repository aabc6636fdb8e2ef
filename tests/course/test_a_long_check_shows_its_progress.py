"""A check over several cases (a fresh database each) shows a bar over its cases once it runs long (9.1's five
cases run 70 episodes, about 20 s), with ``progress=True``, and none for a stub that is not written yet or by default:
a notebook's stored output stays the one line it was."""

from __future__ import annotations

import agentlab.course.exercises as exercises
from agentlab.course.exercises import check


async def _wrong(h, fault):
    return {"violations": {}, "safe_from": None}


async def _stub(h, fault):
    raise NotImplementedError


async def test_a_check_past_its_delay_shows_a_bar_over_its_cases(monkeypatch, capsys):
    monkeypatch.setattr(exercises, "BAR_DELAY_S", 0.0)
    assert await check("9.1", _wrong, progress=True) is False
    err = capsys.readouterr().err
    assert "check 9.1" in err and "5/5" in err


async def test_a_stub_or_a_check_without_progress_shows_no_bar(monkeypatch, capsys):
    # a delay already past when the first case ends: a stub shows no bar however long its case took to fail
    monkeypatch.setattr(exercises, "BAR_DELAY_S", 1e-6)
    assert await check("9.1", _stub, progress=True) is False
    out = capsys.readouterr()
    assert out.out == "not written yet: fill in `first_safe_preset` above\n" and "check 9.1" not in out.err
    assert await check("9.1", _wrong) is False
    assert "check 9.1" not in capsys.readouterr().err
