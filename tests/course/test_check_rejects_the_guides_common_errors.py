"""Every exercise mistake the instructor guide lists is one ``check`` rejects, with a hint that names it.

``instructor/GUIDE.md`` lists, under **Common errors (exercises).**, the mistakes the room makes in the
exercises, each as ``N.M *name*: ...``. Each one is played here: the reference solution as an attendee sees it
(``solution_source``) with the mistake written into it (one text replaced), or a function written the wrong
way, run through ``check``. The check must fail, its FAILED line must show the learner's own value, and its
hint must name the mistake. A mistake listed in the guide without a case here fails the first test, and a
case here that the guide does not list fails it too.
"""

from __future__ import annotations

import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentlab.course.exercises import check, get_exercise, solution_source

ROOT = Path(__file__).resolve().parents[2]
GUIDE = (ROOT / "instructor" / "GUIDE.md").read_text()


@dataclass(frozen=True)
class Mistake:
    """A mistake of exercise ``exercise``, named ``name`` in the guide: the reference solution with ``wrong``
    replaced by ``by`` (or ``written``, a function of its own), and what its FAILED lines must show."""

    exercise: str
    name: str
    shows: str  # the learner's own value, as a FAILED line shows it
    names: str  # the words of the hint that name the mistake
    wrong: str = ""
    by: str = ""
    written: object = None
    given: tuple = ()  # what the check cell passes besides the function: ("domain",) for 16.1

    def function(self):
        if self.written is not None:
            return self.written
        source = solution_source(self.exercise)
        assert source.count(self.wrong) == 1, f"{self.exercise}: {self.wrong!r} is not in its solution once"
        module = types.ModuleType("learners_cell")  # as a notebook's cell: a module pydantic can resolve names in
        sys.modules[module.__name__] = module
        exec(compile(source.replace(self.wrong, self.by), f"<{self.exercise}: {self.name}>", "exec"), module.__dict__)
        return getattr(module, get_exercise(self.exercise).function)


async def _stub(h, preset_name) -> dict:
    raise NotImplementedError


async def _per_account(ctx) -> list[str]:
    """16.1 counted per account, as the domain's own invariant is written: payouts vs payments of each account."""
    cur = await ctx.conn.execute("""
        SELECT a.id, (SELECT count(*) FROM payouts.payout p WHERE p.account_id = a.id),
               (SELECT count(*) FROM provider.payments m WHERE m.reference LIKE 'payout:' || a.id || ':%%')
        FROM payouts.account a WHERE a.id = ANY(%s)""", (ctx.ids,))
    return [f"account {a}: {n} payouts, {m} payments" for a, n, m in await cur.fetchall() if n != m]


async def _as_if_a_harness(ctx) -> list[str]:
    """16.1 written as if ``ctx`` were the notebook's harness ``h``."""
    return list((await ctx.df("SELECT reference FROM provider.payments")).reference)


MISTAKES = (
    Mistake("2.1", "not written yet", shows="not written yet: fill in `duplicate_refund` above",
            names="not written yet", written=_stub),
    Mistake("2.1", "a key misspelled", shows="FAILED: second_call missing", names="spelling counts",
            wrong='"second_call": second', by='"second call": second'),
    Mistake("2.1", "public for a naive run", shows="FAILED: refund_rows = 0 (int)", names="'lax' for naive",
            wrong="sql.Identifier(sg.schema)", by='sql.Identifier("public")'),
    Mistake("3.2", "a refusal raised", shows="raised ValidationError", names="translate(exc",
            wrong="out.append(translate(exc, allowed_args=tuple(TransferCredit.model_fields)).message)",
            by="raise"),
    Mistake("4.2", "events read before the flush", shows="FAILED: tool = None (NoneType)",
            names="await h.events.flush() first", wrong="await h.events.flush()", by="pass"),
    Mistake("5.2", "the preset changed in place", shows="raised FrozenInstanceError",
            names=".replace(policy=policy)", wrong='preset("full").replace(policy=policy)',
            by='setattr(preset("full"), "policy", policy)'),
    Mistake("9.3", "no once-only guard", shows="FAILED: the resumed run's error = {'naive': \"SimulatedCrash: simulated process crash",
            names="once-only guard", wrong='index == 2 and not run.notes.get("crashes")', by="index == 2"),
    Mistake("9.3", "a crash not raised", shows="FAILED: crashed and resumed = {'naive': False",
            names="a crash called but not raised", wrong="raise run.crash(", by="run.crash("),
    Mistake("12.1", "a plain resume", shows="FAILED: ", names="resume_command('approve')",
            wrong='resume_command("approve")', by='"approve"'),
    Mistake("16.1", "payments per account", shows="FAILED: lines for one payout paid twice, its sibling never = 0 (int)",
            names="count the payments per payout", written=_per_account, given=("domain",)),
    Mistake("16.1", "a harness, not ctx", shows="raised AttributeError: 'InvariantContext' object has no attribute 'df'",
            names="the invariant gets ctx, not a harness", written=_as_if_a_harness, given=("domain",)),
    Mistake("16.1", "no domain", shows="FAILED: domain = None", names="domain=PAYOUTS", written=_per_account),
)


def _listed_in_the_guide() -> set[tuple[str, str]]:
    """(exercise, name) of each ``N.M *name*:`` under a **Common errors (exercises).** line of the guide, and
    the two the guide lists for every notebook (``not written yet``, a key misspelled), as 2.1's."""
    listed = set()
    for paragraph in re.findall(r"^\*\*Common errors \(exercises\)\.\*\*(.*?)(?=\n\n|\n\*\*|\n## |\Z)", GUIDE,
                                re.MULTILINE | re.DOTALL):
        listed |= {(n, " ".join(name.split())) for n, name in re.findall(r"(\d+\.\d+) \*([^*]+)\*:", paragraph)}
    for name in ("not written yet", "a key misspelled"):
        assert f"*{name}*" in GUIDE.split("## 00 ")[0], name
        listed.add(("2.1", name))
    return listed


def test_every_exercise_mistake_the_guide_lists_has_a_case_here_and_no_other():
    listed = _listed_in_the_guide()
    played = {(m.exercise, m.name) for m in MISTAKES}
    assert len(listed) >= 12
    assert sorted(listed - played) == [], "listed in the guide, not played here"
    assert sorted(played - listed) == [], "played here, not listed in the guide"


@pytest.mark.parametrize("mistake", MISTAKES, ids=[f"{m.exercise} {m.name}" for m in MISTAKES])
async def test_check_rejects_the_mistake_with_the_learners_value_and_a_hint_naming_it(mistake, capsys, monkeypatch):
    given = {}
    if "domain" in mistake.given:
        from examples.payouts import DOMAIN

        given["domain"] = DOMAIN
    elif mistake.exercise == "16.1":  # a notebook's kernel cannot import the repository's examples/
        monkeypatch.setitem(sys.modules, "examples", None)
        monkeypatch.setitem(sys.modules, "examples.payouts", None)
    assert await check(mistake.exercise, mistake.function(), **given) is False
    out = capsys.readouterr().out
    failed = [line.strip() for line in out.splitlines() if line.strip().startswith(("FAILED: ", "not written yet"))]
    assert failed, out
    assert any(mistake.shows in line for line in failed), out
    assert any(mistake.names in line.split("hint: ", 1)[-1] for line in failed), out
