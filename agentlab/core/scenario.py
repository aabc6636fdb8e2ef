"""Scripted scenarios, for any domain: the tool calls the simulated model will make, and the end state meant.

A :class:`Scenario` names the rows an episode creates (``customers``: whatever the domain's
``create_rows`` takes; billing: customer specs), the batches of tool calls the model emits (``steps``),
and the intended end state (``intended``: whatever the domain's invariants read). Arguments refer to
the episode's rows by position (``C(0)``); :meth:`Scenario.script` turns them into real ids.

A planned call may carry a hallucination: ``args`` is what the model sends first, ``fix`` what it
sends once told which argument is wrong, as an LLM does after a FAILED message naming a field.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class C:
    """A reference to the episode's ``index``-th customer id; ``quote`` adds a stray quote (``"12'"``)."""

    index: int
    quote: bool = False


def _resolve(value: Any, ids: list[int]) -> Any:
    if isinstance(value, C):
        return f"{ids[value.index]}'" if value.quote else ids[value.index]
    if isinstance(value, dict):
        return {k: _resolve(v, ids) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_resolve(v, ids) for v in value)
    return value


@dataclass(frozen=True)
class PlannedCall:
    """One tool call the model will make.

    Attributes:
        tool: the tool's name.
        args: the arguments sent first (may be hallucinated).
        fix: the arguments sent after a FAILED message asks for a correction (None: nothing to fix).
        reorder: on a FAILED "create it first", resend this call after its siblings.
    """

    tool: str
    args: dict
    fix: dict | None = None
    reorder: bool = False

    def resolve(self, ids: list[int]) -> PlannedCall:
        return dataclasses.replace(self, args=_resolve(self.args, ids),
                                   fix=_resolve(self.fix, ids) if self.fix is not None else None)


@dataclass(frozen=True)
class Scenario:
    """A scripted scenario. ``steps`` are batches (one AIMessage each), in order."""

    name: str
    title: str
    prompt: str
    customers: tuple[Any, ...]
    steps: tuple[tuple[PlannedCall, ...], ...]
    intended: Any
    tenant_id: str = "acme"

    def script(self, ids: list[int]) -> list[list[PlannedCall]]:
        """The steps with customer references replaced by the episode's ids."""
        return [[call.resolve(ids) for call in step] for step in self.steps]

    def with_call(self, step: int, index: int, **changes) -> Scenario:
        """A copy with one planned call changed (used by faults that hallucinate an argument)."""
        steps = [list(s) for s in self.steps]
        steps[step][index] = dataclasses.replace(steps[step][index], **changes)
        return dataclasses.replace(self, steps=tuple(tuple(s) for s in steps))

    def with_step(self, calls: tuple[PlannedCall, ...], *, at: int | None = None) -> Scenario:
        """A copy with one more step (batch) inserted at position ``at`` (default: last)."""
        steps = list(self.steps)
        steps.insert(len(steps) if at is None else at, tuple(calls))
        return dataclasses.replace(self, steps=tuple(steps))

    def clean(self) -> Scenario:
        """A copy without the scripted hallucinations: every call sends its corrected arguments first.

        Faults start from the clean form, so that a violation in a fault's row comes from that fault.
        """
        steps = tuple(
            tuple(dataclasses.replace(c, args=c.fix, fix=None) if c.fix is not None else c for c in step)
            for step in self.steps
        )
        return dataclasses.replace(self, steps=steps)

    def calls(self, tool: str | None = None) -> list[tuple[int, int, PlannedCall]]:
        """``(step, index, call)`` for every planned call (of ``tool`` only, when given), in order."""
        return [(s, k, c) for s, step in enumerate(self.steps) for k, c in enumerate(step)
                if tool is None or c.tool == tool]
