"""``python -m agentlab bench [--quick] [--json]``: what the safety costs, side by side, in one run.

Figures (medians over repeats, with their spread; the names are :data:`FIGURES`):

- the tools node's batch against plain psycopg sending exactly the same SQL, pipelined the same way, and
  against the naive nested-transaction pattern (the same statements, one round trip each), with the
  round trips each sent and this process's CPU per batch (:mod:`agentlab.bench.batch`);
- the same three batches behind a network's round trip: the real server behind a TCP delay line
  (:mod:`agentlab.bench.delay_line`) at each RTT of :data:`NETWORK_RTTS_MS`, with the ``SELECT 1`` round trip
  measured there, and the smallest RTT at which the naive pattern takes twice the node's time;
- the full-safety episode against the same graph with no-op tools and with plain-SQL tools (the full node's
  statements for the batch sent from plain psycopg: what the SQL alone costs), on the Postgres checkpointer with
  durability ``sync``, ``async`` and ``exit``, and on LangGraph's in-memory saver (:mod:`agentlab.bench.episodes`);
- the workshop experiment (:data:`WORKSHOP_PRESETS` x :data:`WORKSHOP_FAULTS`) in episodes per second at
  concurrency 1 and at the best of :data:`CONCURRENCY_LEVELS` (in worker processes: :mod:`agentlab.lab.parallel`),
  the lab's CPU milliseconds per episode there and the ceiling it implies on two cores (:func:`two_core_ceiling`),
  and the whole chaos matrix at that level;
- the embedded server's start: cold (initdb and start in a temporary data folder), warm (start on that
  folder) and attach (a new process finding it running); the user's data folder is never touched;
- checkpoint bytes per super-step, and after retention (:func:`agentlab.durable.retention.retention_experiment`);
- tau2-bench retail: its 114 tasks under ``full`` and no fault, wall, this process's CPU and the server's
  (a local server: its backends' ``/proc`` times), and (full
  mode) the whole table, ``full`` and ``naive`` x every retail fault (:func:`agentlab.lab.tau2.run_tau2`);
- peak memory of this process and of the largest child (a worker of the experiment).

Every figure is measured on a fresh database of its own, committing with ``synchronous_commit = off``
(as the chaos command's does): a commit's fsync is the disk's time, not the code's, and on a shared
disk it varies more than anything measured here. :data:`GOALS` are the issue's targets; the report says
which are met. Nothing here is asserted: the figures are printed.

Sources: PostgreSQL docs "synchronous_commit"; Python docs "resource.getrusage".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agentlab.core.safeguards import PRESETS
from agentlab.lab.faults import FAMILIES, FAULTS
from agentlab.runtime import db

# The workshop experiment: six presets x twelve faults x 50 episodes. Six presets: the rungs that
# add a safeguard to ``naive``; twelve faults: the first fault of each of the twelve fault families.
WORKSHOP_PRESETS = tuple(PRESETS)[1:]
WORKSHOP_FAULTS = tuple(next(f.name for f in FAULTS.values() if f.family == fam) for fam in FAMILIES)
WORKSHOP_EPISODES = 50
CONCURRENCY_LEVELS = (8, 16, 32)  # 64 would need more connections than a default server (100) leaves


@dataclass(frozen=True)
class Mode:
    """How much to measure. ``quick`` finishes within a minute on a 2-core machine."""

    name: str
    repeats: int
    batches: int  # per repeat and side
    episodes: int  # per repeat, kind and saver
    c1_episodes: int  # per workshop cell, at concurrency 1
    ladder_episodes: int  # per workshop cell, per concurrency level tried
    best_episodes: int  # per workshop cell, at the best level
    levels: tuple[int, ...]
    matrix_episodes: int  # per chaos-matrix cell, at the best level
    retention_turns: tuple[int, ...]
    network_batches: int  # per repeat, side and round-trip time, behind the delay line


QUICK = Mode("quick", 3, 100, 12, 1, 0, 3, (32,), 1, (1, 8), 10)
FULL = Mode("full", 5, 300, 40, 2, 5, WORKSHOP_EPISODES, CONCURRENCY_LEVELS, WORKSHOP_EPISODES, (1, 20, 60), 60)

# The ``network`` section: round-trip times (ms) a delay line adds in front of the server (0: the server's own
# URL, no line): docker on a laptop, a LAN, a cloud database in the same region take 0.2 to 2 ms. The goal is
# read at NETWORK_GOAL_RTT_MS, the middle of that range.
NETWORK_RTTS_MS = (0.0, 0.2, 0.5, 1.0, 2.0)
NETWORK_GOAL_RTT_MS = 1.0
NETWORK_WARM_ROUNDS = 10  # per RTT, on a new pool: connections, then prepared statements (after 5 uses)


def network_figure(rtt_ms: float, what: str) -> str:
    """The name of a ``network`` figure or ratio: ``network_rtt_<microseconds>us_<what>``."""
    return f"network_rtt_{round(rtt_ms * 1000)}us_{what}"


FIGURES: dict[str, str] = {  # name -> unit
    "node_batch_ms": "ms", "plain_batch_ms": "ms", "naive_batch_ms": "ms", "batch_round_trips": "round trips",
    "naive_batch_round_trips": "round trips", "reference_batch_ms": "ms", "reference_batch_round_trips": "round trips",
    **{f"{side}_batch_cpu_ms": "ms" for side in ("node", "plain", "naive", "reference")},
    **{f"episode_{k}_{s}_per_s": "episodes/s" for s in ("sync", "async", "exit", "memory")
       for k in ("full", "noop", "plainsql", "traced")},
    "workshop_c1_per_s": "episodes/s", "workshop_best_per_s": "episodes/s", "workshop_best_concurrency": "episodes",
    "workshop_best_workers": "processes", "workshop_lab_cpu_ms_per_episode": "ms",
    "workshop_two_core_ceiling_per_s": "episodes/s", "chaos_matrix_per_s": "episodes/s",
    "server_cold_start_s": "s", "server_warm_start_s": "s", "server_attach_s": "s",
    "checkpoint_bytes_per_super_step": "B", "checkpoint_bytes_per_super_step_after_retention": "B",
    "peak_rss_mb": "MB", "peak_rss_child_mb": "MB",
    "tau2_114_full_none_s": "s", "tau2_114_cpu_s": "s", "tau2_114_server_cpu_s": "s", "tau2_table_s": "s",
    **{network_figure(r, f"{what}_ms"): "ms" for r in NETWORK_RTTS_MS
       for what in ("node", "plain", "naive", "select1")},
}
RATIOS: dict[str, tuple[str, str]] = {  # name -> (numerator, denominator)
    "node_vs_plain": ("node_batch_ms", "plain_batch_ms"),
    "naive_vs_node": ("naive_batch_ms", "node_batch_ms"),  # how many times faster the node is
    "naive_vs_node_cpu": ("naive_batch_cpu_ms", "node_batch_cpu_ms"),  # this process's CPU, less moved by load
    # the reference path (savepoints.py, nested transactions) against the pipelined strategy full runs
    "reference_vs_node": ("reference_batch_ms", "node_batch_ms"),
    "reference_vs_node_cpu": ("reference_batch_cpu_ms", "node_batch_cpu_ms"),
    **{f"full_vs_noop_{s}": (f"episode_full_{s}_per_s", f"episode_noop_{s}_per_s")
       for s in ("sync", "async", "exit", "memory")},
    # the kit's own code (full / the same SQL from plain psycopg) and the SQL's own cost (plain SQL / no-op)
    **{f"full_vs_plainsql_{s}": (f"episode_full_{s}_per_s", f"episode_plainsql_{s}_per_s")
       for s in ("sync", "async", "exit", "memory")},
    **{f"plainsql_vs_noop_{s}": (f"episode_plainsql_{s}_per_s", f"episode_noop_{s}_per_s")
       for s in ("sync", "async", "exit", "memory")},
    # OpenTelemetry on (spans kept in memory) against off: under 1, tracing's share of an episode
    **{f"traced_vs_full_{s}": (f"episode_traced_{s}_per_s", f"episode_full_{s}_per_s")
       for s in ("sync", "async", "exit", "memory")},
    "workshop_best_vs_c1": ("workshop_best_per_s", "workshop_c1_per_s"),
    **{network_figure(r, f"{a}_vs_{b}"): (network_figure(r, f"{a}_ms"), network_figure(r, f"{b}_ms"))
       for r in NETWORK_RTTS_MS for a, b in (("naive", "node"), ("node", "plain"))},
}
GOALS: dict[str, tuple[str, str, float]] = {  # name -> (figure or ratio, comparison, target)
    "node_within_1.15x_of_plain": ("node_vs_plain", "<=", 1.15),
    "node_2x_faster_than_naive": ("naive_vs_node", ">=", 2.0),
    f"node_2x_faster_than_naive_at_{NETWORK_GOAL_RTT_MS:g}ms_rtt": (
        network_figure(NETWORK_GOAL_RTT_MS, "naive_vs_node"), ">=", 2.0),
    "full_at_least_85pct_of_noop": ("full_vs_noop_async", ">=", 0.85),
    "workshop_at_least_120_per_s": ("workshop_best_per_s", ">=", 120.0),
    "warm_start_under_2_s": ("server_warm_start_s", "<", 2.0),
    "tau2_114_tasks_in_10_s": ("tau2_114_full_none_s", "<=", 10.0),
    "tau2_table_in_3_min": ("tau2_table_s", "<=", 180.0),
}


@dataclass
class Figure:
    """One measured quantity: its values over repeats, its unit."""

    name: str
    unit: str
    values: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    def as_dict(self) -> dict[str, Any]:
        v = self.values
        return {"median": _round(self.median), "min": _round(min(v)), "max": _round(max(v)),
                "spread_pct": _round((max(v) - min(v)) / self.median * 100) if self.median else 0.0,
                "repeats": len(v), "unit": self.unit}


def _round(x: float) -> float:
    return round(x, 4) if abs(x) < 10 else round(x, 1)


class Report:
    """The figures of one bench run, its ratios and goals, and where it ran."""

    def __init__(self, mode: Mode):
        self.mode = mode
        self.figures: dict[str, Figure] = {}
        self.notes: dict[str, Any] = {}
        self.machine = machine()
        self.started = time.perf_counter()

    def add(self, name: str, values) -> None:
        values = list(values) if isinstance(values, (list, tuple)) else [values]
        self.figures[name] = Figure(name, FIGURES[name], [float(v) for v in values])

    def ratios(self) -> dict[str, float | None]:
        out = {}
        for name, (num, den) in RATIOS.items():
            a, b = self.figures.get(num), self.figures.get(den)
            out[name] = round(a.median / b.median, 3) if a and b and b.median else None
        return out

    def goals(self) -> dict[str, dict[str, Any]]:
        ratios, out = self.ratios(), {}
        for name, (what, op, target) in GOALS.items():
            value = ratios.get(what) if what in RATIOS else (self.figures[what].median if what in self.figures else None)
            met = None if value is None else {"<=": value <= target, ">=": value >= target, "<": value < target}[op]
            out[name] = {"value": None if value is None else _round(value), "target": f"{op} {target}", "met": met}
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"mode": self.mode.name, "seconds": round(time.perf_counter() - self.started, 1),
                "machine": {**self.machine, "load_avg_end": _load()},
                "figures": {n: f.as_dict() for n, f in self.figures.items()},
                "ratios": self.ratios(), "goals": self.goals(), "notes": self.notes}


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):  # no load average on this system
        return None


def machine() -> dict[str, Any]:
    """Where the bench runs: cores, versions, event loop, load average, which server."""
    from importlib.metadata import version

    from agentlab.lab.parallel import event_loop_name

    return {"cpus": os.cpu_count(), "python": platform.python_version(), "psycopg": version("psycopg"),
            "langgraph": version("langgraph"), "langgraph_checkpoint_postgres": version("langgraph-checkpoint-postgres"),
            "event_loop": event_loop_name(), "server": "DATABASE_URL" if os.environ.get(db.ENV_VAR) else "embedded",
            "load_avg_start": _load()}


def _say(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the sections


async def _fresh_harness(purpose: str):
    from agentlab.lab.experiments import commit_without_flush_wait
    from agentlab.runtime.harness import Harness

    url = await asyncio.to_thread(db.create_database, purpose)
    try:
        await asyncio.to_thread(commit_without_flush_wait, url)
        h = await Harness.open(url)
    except BaseException:
        await asyncio.to_thread(db.drop_database, url)
        raise
    h.owns_database = True  # made here for this section: dropped by ``h.close()``
    return h


def _batch_sides(pool, toolset, source, *, reference: bool = False) -> dict:
    """The bench's sides on ``pool``, each a no-argument coroutine function running one fresh batch of
    ``source``: ``node`` (the tools node under ``full``, its pipelined strategy, events logged, not stored),
    ``plain`` (plain psycopg, the same SQL pipelined the same way), ``naive`` (the same statements in nested
    transactions) and, with ``reference``, ``reference`` (the node on its reference path,
    :class:`agentlab.core.batch.SavepointStrategy`)."""
    from agentlab.bench.batch import naive_batch, node_batch, plain_batch
    from agentlab.core.batch import SavepointStrategy, TransactionalToolsNode
    from agentlab.core.events import EventLog
    from agentlab.core.safeguards import preset

    node = TransactionalToolsNode(pool, preset("full"), toolset=toolset, events=EventLog(None))
    sides = {"node": lambda: node_batch(node, source.next()), "plain": lambda: plain_batch(pool, source.next()),
             "naive": lambda: naive_batch(pool, source.next())}
    if reference:
        ref = TransactionalToolsNode(pool, preset("full"), toolset=toolset, events=EventLog(None),
                                     strategy=SavepointStrategy())
        sides["reference"] = lambda: node_batch(ref, source.next())
    return sides


async def _time_sides(sides: dict, *, repeats: int, batches: int, warm_rounds: int):
    """Time ``sides`` (name -> a no-argument coroutine function, as :func:`_batch_sides` makes) after
    ``warm_rounds`` rounds of one call each (pool connections, prepared statements, caches): per repeat,
    ``batches`` calls per side taking turns one by one in a rotating order, so a busy moment hits every side.
    Returns ``(wall, cpu)``: per side, one value per repeat, the median wall milliseconds of a call and the
    mean milliseconds of this process's CPU."""
    for _ in range(warm_rounds):
        for run in sides.values():
            await run()
    order = tuple(sides)
    n = len(order)
    times: dict[str, list[float]] = {side: [] for side in sides}
    cpus: dict[str, list[float]] = {side: [] for side in sides}
    for _ in range(repeats):
        per: dict[str, list[float]] = {side: [] for side in sides}
        cpu: dict[str, list[float]] = {side: [] for side in sides}
        for i in range(batches):
            for side in order[i % n:] + order[:i % n]:
                t0, c0 = time.perf_counter(), time.process_time()
                await sides[side]()
                per[side].append((time.perf_counter() - t0) * 1000)
                cpu[side].append((time.process_time() - c0) * 1000)
        for side in per:
            times[side].append(statistics.median(per[side]))
            cpus[side].append(statistics.mean(cpu[side]))  # CPU adds up: the mean per batch
    return times, cpus


async def bench_batch(report: Report) -> None:
    """The node's batch against plain psycopg on the same SQL and against the naive nested transactions,
    interleaved repeats on one database."""
    from agentlab.bench.batch import (
        BatchSource,
        create_bench_customer,
        naive_batch,
        node_batch,
        plain_batch,
        traced_statements,
    )
    from agentlab.core.batch import SavepointStrategy, TransactionalToolsNode
    from agentlab.core.events import EventLog
    from agentlab.core.safeguards import preset

    m = report.mode
    h = await _fresh_harness("bench_batch")
    try:
        source = BatchSource(await create_bench_customer(h.pool))
        sent_node = await traced_statements(h.url, lambda pool: node_batch(
            TransactionalToolsNode(pool, preset("full"), toolset=h.toolset, events=EventLog(None)), source.next()))
        sent_plain = await traced_statements(h.url, lambda pool: plain_batch(pool, source.next()))
        sent_naive = await traced_statements(h.url, lambda pool: naive_batch(pool, source.next()))
        sent_reference = await traced_statements(h.url, lambda pool: node_batch(
            TransactionalToolsNode(pool, preset("full"), toolset=h.toolset, events=EventLog(None),
                                   strategy=SavepointStrategy()), source.next()))
        report.notes["same_sql"] = sent_node == sent_plain
        report.notes["batch_statements"] = len(sent_node.statements)
        report.add("batch_round_trips", sent_node.round_trips)
        report.add("naive_batch_round_trips", sent_naive.round_trips)
        report.add("reference_batch_round_trips", sent_reference.round_trips)
        times, cpus = await _time_sides(_batch_sides(h.pool, h.toolset, source, reference=True), repeats=m.repeats,
                                        batches=m.batches, warm_rounds=30)
        for side in times:
            report.add(f"{side}_batch_ms", times[side])
            report.add(f"{side}_batch_cpu_ms", cpus[side])
    finally:
        await h.close()


def network_2x_from(report: Report) -> float | None:
    """The smallest RTT of :data:`NETWORK_RTTS_MS` (ms, as asked of the delay line) at which naive/node was
    2 or more, or None when none reached it (or the section did not run)."""
    ratios = report.ratios()
    return next((r for r in NETWORK_RTTS_MS if (ratios.get(network_figure(r, "naive_vs_node")) or 0) >= 2.0), None)


async def bench_network(report: Report) -> None:
    """The batch's three sides (:func:`_batch_sides`, as ``batch`` times them) on the real server behind a
    TCP delay line (:mod:`agentlab.bench.delay_line`) at each round-trip time of :data:`NETWORK_RTTS_MS`
    (half of it added each way; 0 is the server's own URL, no line), and a ``SELECT 1`` on a connection of
    its own taking turns with them: the round trip measured there, under the same load (the RTT asked for,
    plus the line's two hops and the machine's wake-ups)."""
    import psycopg
    from psycopg_pool import AsyncConnectionPool

    from agentlab.bench.batch import BatchSource, create_bench_customer
    from agentlab.bench.delay_line import delay_line, through, url_target

    m = report.mode
    h = await _fresh_harness("bench_network")
    try:
        source = BatchSource(await create_bench_customer(h.pool), thread_id="bench-network")
        target = url_target(h.url)
        for rtt_ms in NETWORK_RTTS_MS:
            async with contextlib.AsyncExitStack() as stack:
                url = h.url
                if rtt_ms > 0:
                    url = through(h.url, *stack.enter_context(delay_line(*target, one_way_delay_ms=rtt_ms / 2)))
                pool = AsyncConnectionPool(url, min_size=1, max_size=4, open=False, kwargs={"autocommit": True})
                await pool.open(wait=True, timeout=30)
                stack.push_async_callback(pool.close)
                ping = await stack.enter_async_context(await psycopg.AsyncConnection.connect(url, autocommit=True))
                sides = {**_batch_sides(pool, h.toolset, source), "select1": lambda ping=ping: ping.execute("SELECT 1")}
                times, _ = await _time_sides(sides, repeats=m.repeats, batches=m.network_batches,
                                             warm_rounds=NETWORK_WARM_ROUNDS)
            for side in times:
                report.add(network_figure(rtt_ms, f"{side}_ms"), times[side])
            med = {side: statistics.median(v) for side, v in times.items()}
            _say(f"  RTT {rtt_ms:g} ms{' (direct)' if rtt_ms == 0 else ''}: SELECT 1 {med['select1']:.3f} ms; node "
                 f"{med['node']:.2f} ms, plain {med['plain']:.2f} ms, naive {med['naive']:.2f} ms; naive/node "
                 f"{med['naive'] / med['node']:.2f}")
        first = network_2x_from(report)
        report.notes["network"] = {
            "rtts_ms": list(NETWORK_RTTS_MS), "batches_per_repeat": m.network_batches,
            "target": ("the server's own URL at 0; else a TCP delay line on 127.0.0.1 forwarding to it"
                       + (" (its Unix-domain socket)" if target[0].startswith("/") else "")),
            "naive_vs_node_2x_from_rtt_ms": first}
    finally:
        await h.close()


async def bench_episodes(report: Report) -> None:
    """Full-safety against no-op tools, per checkpointer and durability."""
    from agentlab.bench.episodes import KINDS, SAVERS, EpisodeBench

    m = report.mode
    h = await _fresh_harness("bench_episodes")
    try:
        bench = EpisodeBench(h)
        for saver in SAVERS:  # warm every graph and pool once
            for kind in KINDS:
                await bench.rate(kind, saver, 3)
        rates = await bench.rates(m.episodes, m.repeats)
        for (kind, saver), values in rates.items():
            report.add(f"episode_{kind}_{saver}_per_s", values)
        report.notes["tracing_ms_per_episode"] = {  # OpenTelemetry on, over off: what a traced run costs more
            saver: round(1000 / statistics.median(rates[("traced", saver)])
                         - 1000 / statistics.median(rates[("full", saver)]), 2) for saver in SAVERS}
        _say("  tracing on costs per episode: " + ", ".join(
            f"{s} {ms:+.2f} ms" for s, ms in report.notes["tracing_ms_per_episode"].items()))
    finally:
        await h.close()


async def bench_workshop(report: Report) -> None:
    """The workshop experiment at concurrency 1 and at the best level; the chaos matrix at that level."""
    from agentlab.lab.experiments import run_experiment
    from agentlab.lab.parallel import default_workers

    m = report.mode
    cells = len(WORKSHOP_PRESETS) * len(WORKSHOP_FAULTS)
    c1 = await run_experiment(m.c1_episodes, WORKSHOP_PRESETS, WORKSHOP_FAULTS, concurrency=1, progress=False)
    report.add("workshop_c1_per_s", c1.episodes_per_s)
    levels = m.levels
    tried: dict[tuple[int, int], float] = {}
    if len(levels) > 1 and m.ladder_episodes:
        for level in levels:
            workers = default_workers(WORKSHOP_EPISODES * cells)
            r = await run_experiment(m.ladder_episodes, WORKSHOP_PRESETS, WORKSHOP_FAULTS, concurrency=level,
                                     workers=workers, progress=False)
            tried[(level, workers)] = r.episodes_per_s
            _say(f"  workshop at concurrency {level} ({workers} worker(s)): {r.episodes_per_s:.1f} episodes/s")
        level, workers = max(tried, key=tried.get)
    else:
        level, workers = levels[0], default_workers(WORKSHOP_EPISODES * cells)
    report.notes["workshop_levels_tried"] = {f"{c}x{w}": round(v, 1) for (c, w), v in tried.items()}
    best = await run_experiment(m.best_episodes, WORKSHOP_PRESETS, WORKSHOP_FAULTS, concurrency=level,
                                workers=workers, progress=None)
    report.add("workshop_best_per_s", best.episodes_per_s)
    report.add("workshop_best_concurrency", level)
    report.add("workshop_best_workers", workers)
    lab_cpu_ms = best.cpu_s / max(best.episodes, 1) * 1000
    report.add("workshop_lab_cpu_ms_per_episode", lab_cpu_ms)
    report.add("workshop_two_core_ceiling_per_s", two_core_ceiling(lab_cpu_ms))
    report.notes["workshop"] = {"presets": list(WORKSHOP_PRESETS), "faults": list(WORKSHOP_FAULTS),
                                "episodes": best.episodes, "episodes_per_cell": m.best_episodes,
                                "wall_s": round(best.wall_s, 2), "errors": int(best.rows["error"].notna().sum())}
    matrix = await run_experiment(m.matrix_episodes, concurrency=level, progress=None,
                                  workers=default_workers(m.matrix_episodes * len(PRESETS) * len(FAULTS)))
    report.add("chaos_matrix_per_s", matrix.episodes_per_s)
    report.notes["chaos_matrix"] = {"episodes": matrix.episodes, "wall_s": round(matrix.wall_s, 2),
                                    "workers": matrix.workers}


def two_core_ceiling(lab_cpu_ms_per_episode: float) -> float:
    """Episodes per second two cores could run if they ran nothing but the lab: ``2000 /`` the lab's CPU
    milliseconds per episode (an upper bound: PostgreSQL's own CPU and the machine's other load come off it).
    0.0 when nothing was measured."""
    return 2000.0 / lab_cpu_ms_per_episode if lab_cpu_ms_per_episode > 0 else 0.0


TAU2_TABLE_CONCURRENCY = 6  # workers: 7 connections each; the waiting faults overlap with the computing ones


async def bench_tau2(report: Report) -> None:
    """tau2-bench retail: the 114 tasks under ``full`` and no fault (repeats), and the whole table once in
    the full mode (``full`` and ``naive`` x every retail fault: 2,052 task runs with its 9 faults); each
    checks every hash."""
    from agentlab.lab.tau2 import FAULTS as TAU2_FAULTS
    from agentlab.lab.tau2 import run_tau2

    walls, cpus, servers = [], [], []
    for _ in range(report.mode.repeats):
        r = await run_tau2(["full"], ["none"], progress=False)
        walls.append(r.seconds)
        cpus.append(r.cpu_s)
        servers.append(r.server_cpu_s)
        report.notes["tau2_114_matched"] = sum(x.matches for x in r.runs)
    report.add("tau2_114_full_none_s", walls)
    report.add("tau2_114_cpu_s", cpus)
    if None not in servers:  # the server's processes are visible from here (a local server)
        report.add("tau2_114_server_cpu_s", servers)
    if report.mode.name == "full":
        table = await run_tau2(["full", "naive"], list(TAU2_FAULTS), concurrency=TAU2_TABLE_CONCURRENCY,
                               progress=None)
        report.add("tau2_table_s", table.seconds)
        report.notes["tau2_table"] = {"runs": len(table.runs), "cpu_s": round(table.cpu_s, 1),
                                      "matched": {f"{row['preset']}/{row['fault']}": row["matched"]
                                                  for row in table.table()}}


SERVER_START = """
import json, sys, types
pkg = types.ModuleType("agentlab"); pkg.__path__ = [sys.argv[1]]; sys.modules["agentlab"] = pkg  # db alone
from agentlab.runtime import db
if sys.argv[2] == "stop":
    print(json.dumps({"stopped": db.stop_embedded()}))
else:
    info = db.start_embedded()
    print(json.dumps({"start_s": info.start_s, "cold": info.cold}))
"""


def _server_step(home: Path, action: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != db.ENV_VAR}
    env["AGENTLAB_HOME"] = str(home)
    out = subprocess.run([sys.executable, "-c", SERVER_START, str(Path(__file__).parents[1]), action], env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_server(report: Report) -> None:
    """Cold, warm and attach times of :func:`agentlab.runtime.db.start_embedded` in a temporary data folder.

    The kit's ``db`` module runs alone in a new process (without the package's other imports, which would
    add their import time), as the kit's first use of the server does."""
    with tempfile.TemporaryDirectory(prefix="agentlab-bench-") as tmp:
        home = Path(tmp)
        try:
            cold = _server_step(home, "start")
            _server_step(home, "stop")
            warm = _server_step(home, "start")
            attach = _server_step(home, "start")
        finally:
            _server_step(home, "stop")
    if not cold["cold"] or warm["cold"]:
        raise RuntimeError("the bench's temporary server did not start cold, then warm")
    report.add("server_cold_start_s", cold["start_s"])
    report.add("server_warm_start_s", warm["start_s"])
    report.add("server_attach_s", attach["start_s"])


async def bench_checkpoints(report: Report) -> None:
    """Checkpoint row bytes per super-step before and after a retention run (threads of growing length)."""
    from agentlab.durable.retention import retention_experiment

    h = await _fresh_harness("bench_checkpoints")
    try:
        summary = (await retention_experiment(h, turns=report.mode.retention_turns)).summary()
    finally:
        await h.close()
    report.add("checkpoint_bytes_per_super_step", summary["bytes_per_super_step_before"])
    report.add("checkpoint_bytes_per_super_step_after_retention", summary["bytes_per_super_step_after"])
    report.notes["retention"] = {k: summary[k] for k in ("super_steps", "row_bytes_before", "row_bytes_after")}


def bench_memory(report: Report) -> None:
    """Peak resident memory of this process and of its largest child (``ru_maxrss``, in kB on Linux)."""
    try:
        import resource
    except ImportError:  # Windows: the current size instead of the peak, and no children
        import psutil

        report.add("peak_rss_mb", psutil.Process().memory_info().rss / 2**20)
        report.add("peak_rss_child_mb", 0.0)
        report.notes["memory"] = "current size, not the peak (no resource module here)"
        return
    scale = 2**20 if sys.platform == "darwin" else 2**10  # macOS reports bytes, Linux kB
    report.add("peak_rss_mb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale)
    report.add("peak_rss_child_mb", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / scale)


SECTIONS = ("batch", "network", "episodes", "workshop", "server", "checkpoints", "tau2")
QUICK_SECTIONS = SECTIONS[:-1]  # --quick leaves tau2 out (a minute or more); --quick --only tau2 measures it
TAU2_FIGURES = ("tau2_114_full_none_s", "tau2_114_cpu_s", "tau2_114_server_cpu_s", "tau2_table_s")


async def run_bench(mode: Mode = QUICK, sections: tuple[str, ...] = SECTIONS) -> Report:
    """Measure ``sections`` (all by default) in ``mode``; return the report. Progress goes to stderr."""
    report = Report(mode)
    steps = {"batch": ("the tools node's batch against plain psycopg", bench_batch),
             "network": ("the same batches behind a TCP delay line, per round-trip time", bench_network),
             "episodes": ("full-safety episodes against no-op tools, per checkpointer", bench_episodes),
             "workshop": ("the workshop experiment, at concurrency 1 and the best level", bench_workshop),
             "server": ("the embedded server's cold, warm and attach start", bench_server),
             "checkpoints": ("checkpoint bytes per super-step, before and after retention", bench_checkpoints),
             "tau2": ("tau2-bench retail: 114 tasks under full, and the whole table", bench_tau2)}
    for name in sections:
        title, fn = steps[name]
        _say(f"{title} ...")
        t0 = time.perf_counter()
        result = fn(report)
        if asyncio.iscoroutine(result):
            await result
        else:
            await asyncio.sleep(0)
        _say(f"  done in {time.perf_counter() - t0:.1f} s")
    bench_memory(report)
    return report


# --------------------------------------------------------------------------- output

ROWS = (  # the text table: (label, figure, ratio beside it)
    ("tools node, one batch of 3 calls (ms)", "node_batch_ms", "node_vs_plain"),
    ("plain psycopg, the same SQL (ms)", "plain_batch_ms", None),
    ("naive nested transactions, same SQL (ms)", "naive_batch_ms", "naive_vs_node"),
    ("tools node, reference path (ms)", "reference_batch_ms", "reference_vs_node"),
    ("  this process's CPU: node (ms)", "node_batch_cpu_ms", None),
    ("  reference path (ms)", "reference_batch_cpu_ms", "reference_vs_node_cpu"),
    ("  plain psycopg (ms)", "plain_batch_cpu_ms", None),
    ("  naive nested transactions (ms)", "naive_batch_cpu_ms", "naive_vs_node_cpu"),
    *(row for r in NETWORK_RTTS_MS for row in (
        (f"RTT {r:g} ms{' (direct)' if r == 0 else ''}: SELECT 1 (ms)", network_figure(r, "select1_ms"), None),
        ("  node batch (ms)", network_figure(r, "node_ms"), network_figure(r, "node_vs_plain")),
        ("  plain psycopg (ms)", network_figure(r, "plain_ms"), None),
        ("  naive nested transactions (ms)", network_figure(r, "naive_ms"), network_figure(r, "naive_vs_node")))),
    *((f"episode/s, {s}: full safety", f"episode_full_{s}_per_s", f"full_vs_noop_{s}") for s in
      ("sync", "async", "exit", "memory")),
    *((f"episode/s, {s}: no-op tools", f"episode_noop_{s}_per_s", None) for s in ("sync", "async", "exit", "memory")),
    *((f"episode/s, {s}: plain-SQL tools", f"episode_plainsql_{s}_per_s",
       f"plainsql_vs_noop_{s}") for s in ("sync", "async", "exit", "memory")),
    *((f"episode/s, {s}: full, traced", f"episode_traced_{s}_per_s",
       f"traced_vs_full_{s}") for s in ("sync", "async", "exit", "memory")),
    ("workshop episodes/s, concurrency 1", "workshop_c1_per_s", None),
    ("workshop episodes/s, best level", "workshop_best_per_s", "workshop_best_vs_c1"),
    ("workshop lab CPU per episode (ms)", "workshop_lab_cpu_ms_per_episode", None),
    ("  2-core ceiling, lab alone (episodes/s)", "workshop_two_core_ceiling_per_s", None),
    ("chaos matrix episodes/s, best level", "chaos_matrix_per_s", None),
    ("embedded server cold start (s)", "server_cold_start_s", None),
    ("embedded server warm start (s)", "server_warm_start_s", None),
    ("embedded server attach (s)", "server_attach_s", None),
    ("checkpoint bytes per super-step", "checkpoint_bytes_per_super_step", None),
    ("  after retention", "checkpoint_bytes_per_super_step_after_retention", None),
    ("tau2 retail, 114 tasks, full, no fault (s)", "tau2_114_full_none_s", None),
    ("  this process's CPU (s)", "tau2_114_cpu_s", None),
    ("  the server's CPU on its databases (s)", "tau2_114_server_cpu_s", None),
    ("tau2 retail, the whole table (s)", "tau2_table_s", None),
    ("peak memory, this process (MB)", "peak_rss_mb", None),
    ("peak memory, largest child (MB)", "peak_rss_child_mb", None),
)


def render(report: Report) -> str:
    """The bench as a text table: median, min-max over repeats, and the ratio beside each pair."""
    d = report.as_dict()
    fig, ratios = d["figures"], d["ratios"]
    lines = [f"agentlab bench ({d['mode']}, {d['seconds']} s): {d['machine']['cpus']} cores, Python "
             f"{d['machine']['python']}, psycopg {d['machine']['psycopg']}, langgraph {d['machine']['langgraph']}, "
             f"checkpoint-postgres {d['machine']['langgraph_checkpoint_postgres']}, {d['machine']['event_loop']}, "
             f"load {d['machine']['load_avg_start']}", "",
             f"{'':44}{'median':>10}{'min':>10}{'max':>10}  ratio"]
    for label, name, ratio in ROWS:
        f = fig.get(name)
        if f is None:
            continue
        r = f"{ratios[ratio]:.3f}" if ratio and ratios.get(ratio) is not None else ""
        lines.append(f"{label:44}{f['median']:>10}{f['min']:>10}{f['max']:>10}  {r}")
    if "workshop_best_concurrency" in fig:
        lines.append(f"(best level: concurrency {int(fig['workshop_best_concurrency']['median'])} in "
                     f"{int(fig['workshop_best_workers']['median'])} worker process(es), "
                     f"{fig['workshop_lab_cpu_ms_per_episode']['median']} ms of the lab's CPU per episode: two cores "
                     f"running the lab alone top out at {fig['workshop_two_core_ceiling_per_s']['median']} episodes/s)")
    kit = [f"{s} {ratios[f'full_vs_plainsql_{s}']:.3f}" for s in ("sync", "async", "exit", "memory")
           if ratios.get(f"full_vs_plainsql_{s}") is not None]
    if kit:
        lines.append(f"(full safety / the full node's SQL from plain psycopg, episodes/s: {', '.join(kit)}: the kit's "
                     "own code; plain SQL / no-op tools is what the statements cost)")
    if "tracing_ms_per_episode" in d["notes"]:
        cost = ", ".join(f"{s} {ms:+.2f}" for s, ms in d["notes"]["tracing_ms_per_episode"].items())
        lines.append(f"(OpenTelemetry on, over off, ms per episode: {cost}; off, a graph is built without it)")
    if "same_sql" in d["notes"]:
        lines.append(f"(node and plain psycopg sent the same SQL: {d['notes']['same_sql']}, "
                     f"{int(fig['batch_round_trips']['median'])} round trips per batch; the naive nested "
                     f"transactions {int(fig['naive_batch_round_trips']['median'])}, the node's reference path "
                     f"{int(fig['reference_batch_round_trips']['median'])})")
    if "network" in d["notes"]:
        first, rtts = d["notes"]["network"]["naive_vs_node_2x_from_rtt_ms"], d["notes"]["network"]["rtts_ms"]
        ping = fig.get(network_figure(first, "select1_ms"), {}).get("median") if first is not None else None
        asked = ", ".join(f"{r:g}" for r in rtts)
        lines.append(f"(behind the delay line, naive/node first reached 2 at RTT {first:g} ms: SELECT 1 measured "
                     f"{ping} ms there)" if first is not None else
                     f"(behind the delay line, naive/node reached 2 at none of the RTTs {asked} ms)")
    lines += ["", "goals:"]
    for name, g in d["goals"].items():
        mark = "n/a" if g["met"] is None else ("met" if g["met"] else "MISSED")
        lines.append(f"  {name:38} {str(g['value']):>10} (target {g['target']}): {mark}")
    return "\n".join(lines)


def add_arguments(parser) -> None:
    """The ``bench`` subcommand's options."""
    parser.add_argument("--quick", action="store_true", help="fewer repeats and episodes: within a minute")
    parser.add_argument("--json", action="store_true", help="print one JSON object with every figure and ratio")
    from agentlab.lab.options import Distinct, positive_int

    parser.add_argument("--repeats", type=positive_int, default=None, metavar="N",
                        help="repeat each measurement N times (default: 3 with --quick, 5 without); 1 is a smoke run, "
                             "more a steadier median")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=None, metavar="SECTION", action=Distinct,
                        help=f"measure these sections only ({' '.join(SECTIONS)})")


def main(args) -> int:
    """Run the ``bench`` subcommand; print its table (or JSON); 0 on success."""
    import logging

    from agentlab.lab.parallel import run_loop

    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)  # the workshop's faults kill backends
    mode = QUICK if args.quick else FULL
    if args.repeats is not None:
        mode = replace(mode, repeats=args.repeats)
    report = run_loop(run_bench(mode,
                                tuple(args.only or (QUICK_SECTIONS if args.quick else SECTIONS))))
    print(json.dumps(report.as_dict()) if args.json else render(report))
    return 0
