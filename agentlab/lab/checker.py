"""The lab's checker (Jepsen's): what went wrong in an episode, read from the database, the provider's records and
the message history, never from the code's own bookkeeping: the generic kinds (every call answered once, no
leak, ledger rows exactly for applied calls, no half-applied batch under the atomic policy, each queued charge
paid once) and the domain's own invariants (:func:`agentlab.lab.invariants.check_episode`).
"""

from __future__ import annotations

from typing import Any

from agentlab.core.safeguards import Safeguards
from agentlab.lab.invariants import Violation, check_episode
from agentlab.lab.loop import Checker
from agentlab.runtime.harness import Episode


def episode_checker(pool, scenario: Any, safeguards: Safeguards, domain) -> Checker:
    """The checker of one episode of ``scenario`` under ``safeguards`` on ``domain`` (its invariants), reading
    through ``pool`` (the harness's: another session than the agent's). ``await checker(episode)`` returns the
    list of :class:`agentlab.lab.invariants.Violation` (empty: the episode held).

    Raises (from the call):
        agentlab.core.errors.DomainError: a domain's invariant raised (a domain bug, not a violation).
    """

    async def check(episode: Episode) -> list[Violation]:
        return await check_episode(pool, episode, scenario, safeguards, domain)

    return check
