"""The lab's one loop, shaped as Jepsen's test: a **client** (the agent under test), a **workload** (what the
user asks), a **nemesis** (the fault) and a **checker** (the invariants), run by :func:`run`.

Every episode of the failure lab goes through it, whoever the agent is:

- :class:`agentlab.lab.clients.kit.KitClient`: the kit's own graph under a preset, in an agent process of
  the :class:`agentlab.lab.runner.Lab` (``Lab.run``; the tau2 replays and the experiments use it);
- :class:`agentlab.lab.clients.graph_agent.GraphAgentClient`: a LangGraph agent built as its user builds it
  (LangGraph's prebuilt ``ToolNode``, LangChain's ``create_agent``, your own), each life of it a process of
  its own (``Yardstick.run``).

One episode, in order::

    open the agent's process          client.open()
    arm the fault                      nemesis.arm(run)   (before or after the agent is built: client.arms_after_build)
    build the agent                    client.build()
    the user's turn                    client.invoke(prompt)         a crash ends it; an error is a result
    wait for work left running         client.settle()
    after a crash: a new process       nemesis.before_restart(run), client.recover()
        resumes the thread             client.invoke(None)           (no checkpoint: the prompt again, if the fault says so)
    the end state                      client.state() when the turn ended without one
    drain the outbox                   run.worker.drain()            a worker crash: a new worker drains again
    write what the process buffers     client.flush()                (its events)
    disarm, close                      nemesis.disarm(run), client.close()
    check                              checker(client.episode(state, drain))

The workload of an episode is a domain's scenario chosen by the seed and prepared by the fault
(:mod:`agentlab.lab.workloads.scenarios`); the checker is :func:`agentlab.lab.checker.episode_checker`'s (the
generic kinds and the domain's invariants); the nemesis is the fault (:mod:`agentlab.lab.nemesis`, the catalog
:mod:`agentlab.lab.faults`, which also takes a domain's own faults).

What differs between agents (which process, which graph, how an error is written down) lives in the
client; the loop holds what is the same for all of them. A fault acts on ``client.run`` (a
:class:`RunAccess`: the harness's pool and provider, the episode's thread, notes and
saver). A workload of two conversations at once (the concurrency family) is one client too
(:class:`agentlab.lab.clients.pairs.PairClient`: both runs at once, met at a rendezvous). A durable engine's
agent is a client whose every life is a child process (:class:`agentlab.lab.clients.engine.EngineClient`: DBOS,
Temporal, Pydantic AI on DBOS).

What does not run through it, on purpose: the durable patterns' faults (:mod:`agentlab.lab.durable_faults`: a
saga's lock holder killed, an abort past the pivot, retention racing a live thread). They have no agent turn to
play (no prompt, no model, no tool call ids) and each plays two actors against one run (two saga runners; a
runner and an operator; retention and a returning user), which one client under one nemesis does not describe;
forcing them through ``invoke(prompt)`` would hide the actors the lesson is about. They keep the loop's other
halves: each fault arms from outside the code under test, and its checker reads the database, the provider and
the notifier (:func:`agentlab.lab.durable_faults.check_payout_run`).

Sources: Jepsen's test map (``:client``, ``:nemesis``, ``:generator``, ``:checker``; jepsen.io);
LangGraph docs "Persistence" (resuming a thread with ``None`` input, durability modes).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from langgraph.errors import EmptyInputError

from agentlab.core.errors import SimulatedCrash, is_infrastructure
from agentlab.core.outbox import DrainStats, OutboxWorker
from agentlab.lab.process import CrashableSaver
from agentlab.runtime.harness import Episode


class RunAccess:
    """What a fault reaches through one episode's run, whichever runner made it (:class:`agentlab.lab.runner.EpisodeRun`,
    :class:`agentlab.lab.clients.agent_process.AgentRun`): the harness's pool and provider, the preset's schema, and a process crash.
    A subclass has ``harness``, ``safeguards``, ``thread_id`` and ``notes``, and names its saver in
    :meth:`episode_saver`."""

    def episode_saver(self) -> CrashableSaver:
        raise NotImplementedError

    @property
    def pool(self):
        return self.harness.pool

    @property
    def provider(self):
        return self.harness.provider

    @property
    def schema(self) -> str:
        return self.safeguards.schema

    def crash(self, where: str) -> SimulatedCrash:
        """The process dies here: its saver writes nothing more for this thread. Raise the result."""
        self.episode_saver().kill(self.thread_id)
        self.notes.setdefault("crashes", []).append(where)
        return SimulatedCrash(f"simulated process crash {where} (thread {self.thread_id})")


Checker = Callable[[Episode], Awaitable[list]]
"""``await checker(episode)`` -> the episode's violations (:func:`agentlab.lab.invariants.check_episode` with
the harness's pool, the scenario, the preset and the domain bound: the generic kinds and the domain's own)."""


@dataclass(frozen=True)
class Workload:
    """What is asked of the agent in one episode: the domain's scenario (prepared by the fault) and the
    user's message."""

    scenario: Any
    prompt: str


class Client(Protocol):
    """The agent under test, for one episode (Jepsen's client). ``run`` is what the fault acts on.

    ``invoke(prompt)`` plays one user turn (``prompt`` None: resume the thread from its checkpoint) and
    returns the graph's end state; it raises :class:`agentlab.core.errors.SimulatedCrash` where the process
    dies, :class:`langgraph.errors.EmptyInputError` when a resume finds no checkpoint, and what the agent
    raised otherwise (the loop records it with :meth:`record_error`)."""

    run: Any

    def arms_after_build(self, nemesis) -> bool: ...
    async def open(self) -> None: ...
    async def build(self) -> None: ...
    async def invoke(self, prompt: str | None) -> dict: ...
    def record_error(self, exc: BaseException | None) -> None: ...
    def describe(self, exc: BaseException) -> str: ...
    async def settle(self) -> None: ...
    async def recover(self, nemesis) -> None: ...
    async def resubmit(self) -> None: ...
    async def state(self) -> dict: ...
    async def new_worker(self) -> OutboxWorker: ...
    async def flush(self) -> None: ...
    async def close(self) -> None: ...
    def episode(self, state: dict, drain: DrainStats | None) -> Episode: ...


async def run(client: Client, workload: Workload, nemesis, checker: Checker | None) -> tuple[Episode, list]:
    """Play ``workload`` on ``client`` with ``nemesis`` injected, then check it.

    Returns:
        ``(episode, violations)``: the :class:`agentlab.runtime.harness.Episode` the client made of the end
        state (messages, error, drain) and ``await checker(episode)`` (``[]`` when ``checker`` is None).
    """
    r = client.run
    state: dict | None = None
    drain: DrainStats | None = None
    try:
        await client.open()
        after = client.arms_after_build(nemesis)
        if not after:
            await nemesis.arm(r)  # before the build: a fault may change what the agent is handed
        await client.build()
        if after:
            await nemesis.arm(r)  # after the build: a fault hooks into what the build made
        state = await _first_turn(client, nemesis, workload.prompt)
        await client.settle()
        if r.crashed:
            await nemesis.before_restart(r)
            await client.recover(nemesis)
            state = await _resume(client, nemesis, workload.prompt)
            await client.settle()
        if state is None:
            state = await client.state()
        if r.safeguards.outbox:  # without the outbox no tool writes an outbox row: nothing to drain
            drain = await _drain(client, nemesis)
        await client.flush()
    finally:
        await nemesis.disarm(r)
        await client.close()
    ep = client.episode(state, drain)
    return ep, (await checker(ep) if checker is not None else [])


async def _first_turn(client: Client, nemesis, prompt: str) -> dict | None:
    """The user's turn. A crash marks the run; an error is recorded; a server restart under the run (a fault
    that ``restarts_server``) is met as after any retriable error: the user resumes the thread once."""
    try:
        return await client.invoke(prompt)
    except SimulatedCrash:
        client.run.crashed = True
    except Exception as exc:  # noqa: BLE001 (what the agent raised is a result)
        client.record_error(exc)
        if nemesis.restarts_server and is_infrastructure(exc):
            client.run.notes["run_error"] = client.describe(exc)
            try:
                state = await client.invoke(None)
            except Exception as again:  # noqa: BLE001 (the episode's row shows it, as for the first run)
                client.record_error(again)
            else:
                client.record_error(None)
                return state
    return None


async def _resume(client: Client, nemesis, prompt: str) -> dict | None:
    """The thread resumed in the new process. With no checkpoint to resume (durability ``"exit"``), a fault
    that ``resubmits`` has the user send the prompt again: the model's tool call ids are new (case C23)."""
    try:
        try:
            return await client.invoke(None)
        except EmptyInputError:
            if not nemesis.resubmits:
                raise
            client.run.notes["resume"] = "no checkpoint; the prompt was sent again"
            await client.resubmit()
            return await client.invoke(prompt)
    except SimulatedCrash as exc:  # a rearmed fault struck again: the resumed process died too
        client.run.notes["crashed_again"] = True
        client.record_error(exc)
    except Exception as exc:  # noqa: BLE001 (what the agent raised is a result)
        client.record_error(exc)
    return None


async def _drain(client: Client, nemesis) -> DrainStats:
    """Drain the episode's outbox; a worker that died after the provider call is replaced by a new one, in
    the restarted process, which drains again."""
    r = client.run
    try:
        return await r.worker.drain()
    except SimulatedCrash:
        r.worker_crashed = True
        await nemesis.before_restart(r)
        return await (await client.new_worker()).drain()
