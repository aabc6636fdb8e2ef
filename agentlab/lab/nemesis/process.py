"""Faults of the process: a crash after the business COMMIT or in the middle of a batch (the thread resumes
from its checkpoint in a new process), and a restart of the database server under a batch.

Part of the fault catalog (:mod:`agentlab.lab.faults`, its registry and table).
"""

from __future__ import annotations

from dataclasses import dataclass

from agentlab.lab.nemesis.base import EpisodeRunLike, Fault


@dataclass(frozen=True)
class CrashAfterCommit(Fault):
    """The process dies right after the first batch's COMMIT returned, before LangGraph writes the
    super-step's checkpoint; the thread resumes from its last checkpoint in a new process."""

    resumes = True

    async def arm(self, run: EpisodeRunLike) -> None:
        async def die(calls) -> None:
            if not run.notes.get("crashes"):
                raise run.crash("after the business commit, before the checkpoint write")

        run.node.hooks.after_commit.append(die)


@dataclass(frozen=True)
class CrashUnderExitDurability(CrashAfterCommit):
    """Case C23: the episode runs with LangGraph ``durability="exit"`` (a checkpoint only when a run ends) and
    the process dies right after the first batch's COMMIT. The new process finds no checkpoint, so
    nothing to resume (LangGraph's ``EmptyInputError``); the user sends the prompt again and the model
    sends the work again under new tool call ids, which the ledger cannot recognise. Natural keys refuse
    a second credit memo, invoice or refund; ``ApplyCredit`` has none, so its deduction is applied twice
    under every preset (``balance_mismatch``), and the first run's ledger rows answer no call of the
    thread (``ledger_mismatch``). The safeguard is not a preset: run with ``"sync"`` or ``"async"``."""

    forced_durability = "exit"
    resubmits = True


@dataclass(frozen=True)
class CrashMidNode(Fault):
    """The process dies before call ``at_call`` of a batch (inside its transaction); the thread
    resumes from its last checkpoint in a new process."""

    at_call: int = 1
    resumes = True

    async def arm(self, run: EpisodeRunLike) -> None:
        async def die(call, index: int) -> None:
            if index == self.at_call and not run.notes.get("crashes"):
                raise run.crash(f"mid-node, before call {index + 1}")

        run.node.hooks.before_call.append(die)


@dataclass(frozen=True)
class ServerRestart(Fault):
    """Before call ``at_call`` of the first batch that reaches it, the database server is restarted
    (``pg_ctl restart -m <mode>``; the call waits until the new server takes connections): the batch's
    transaction is cut, and so is every other session on the server, every pooled connection of the process
    among them. The episode goes on as a user would: a run that ended on an error is resumed once from its
    checkpoint, and the outbox is drained (case C46).

    Every session on the server is cut, not only the episode's: episodes of this fault run alone, after the
    others (:attr:`restarts_server`), on the kit's embedded server only, with synchronous commits (an
    ``immediate`` shutdown loses commits acknowledged but not yet flushed under ``synchronous_commit = off``).
    Checkpoints are written per super-step while the next node runs (``durability="async"``, the harness's
    default), so a restart also cuts a checkpoint write in flight."""

    mode: str = "fast"
    at_call: int = 1
    restarts_server = True
    forced_durability = "async"

    def resumes_graph(self, safeguards) -> bool:
        return True  # a run cut by the restart resumes from its checkpoint

    async def arm(self, run: EpisodeRunLike) -> None:
        async def restart(call, index: int) -> None:
            if index != self.at_call or "restart_s" in run.notes:
                return
            run.notes["restart_s"] = await run.harness.restart_server(self.mode)

        run.node.hooks.before_call.append(restart)
