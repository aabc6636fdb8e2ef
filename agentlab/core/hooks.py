"""Fault-injection hooks: the one way the tools node, the outbox worker and the saga runner call them.

A hook is a callable, sync or async, that a test or a fault (:mod:`agentlab.lab.faults`) appends to a
list on a ``hooks`` dataclass of the component (``NodeHooks``, ``WorkerHooks``, ``SagaHooks``); the
component runs each list at its named point with :func:`run_hooks`. Raising from a hook stands for what
would go wrong at that point (a :class:`agentlab.core.errors.SimulatedCrash` is a process dying there).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

Hook = Callable[..., Awaitable[None] | None]


async def run_hooks(hooks: list[Hook], *args: Any) -> None:
    """Call each of ``hooks`` with ``args`` in order, awaiting those that return an awaitable. The list
    is copied first, so a hook may remove itself (a one-shot fault) while it runs."""
    for hook in list(hooks):
        result = hook(*args)
        if result is not None:
            await result
