"""The bench's sections: each measures its figures and adds them to a :class:`agentlab.bench.report.Report`.

=============  ===================================================================================
section        what it measures (figure names in :data:`agentlab.bench.figures.FIGURES`)
=============  ===================================================================================
batch          the tools node's batch against plain psycopg and the naive nested transactions
               (:func:`bench_batch`)
network        the same batches behind a TCP delay line, per round-trip time (:func:`bench_network`)
episodes       full-safety episodes against no-op and plain-SQL tools, per saver (:func:`bench_episodes`)
workshop       the workshop experiment and the chaos matrix, episodes per second (:func:`bench_workshop`)
tau2           tau2-bench retail's 114 tasks, and the whole table in the full mode (:func:`bench_tau2`)
server         the embedded server's cold, warm and attach start (:func:`bench_server`)
checkpoints    checkpoint bytes per super-step, before and after retention (:func:`bench_checkpoints`)
=============  ===================================================================================

and :func:`bench_memory`, the peak memory, after them. Every figure is measured on a fresh database of its own,
committing with ``synchronous_commit = off`` (see :mod:`agentlab.bench.suite`).

Sources: PostgreSQL docs "synchronous_commit"; Python docs "resource.getrusage".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agentlab.bench.figures import (
    NETWORK_RTTS_MS,
    NETWORK_WARM_ROUNDS,
    WORKSHOP_EPISODES,
    WORKSHOP_FAULTS,
    WORKSHOP_PRESETS,
    network_figure,
)
from agentlab.bench.report import Report, say
from agentlab.core.safeguards import PRESETS
from agentlab.lab.faults import FAULTS
from agentlab.runtime import db


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
            say(f"  RTT {rtt_ms:g} ms{' (direct)' if rtt_ms == 0 else ''}: SELECT 1 {med['select1']:.3f} ms; node "
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
        say("  tracing on costs per episode: " + ", ".join(
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
            say(f"  workshop at concurrency {level} ({workers} worker(s)): {r.episodes_per_s:.1f} episodes/s")
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


def engines_missing() -> list[str]:
    """The optional engines that are not installed here (``["dbos", "temporalio", "pydantic_ai"]`` at most)."""
    import importlib.util

    return [m for m in ("dbos", "temporalio", "pydantic_ai") if importlib.util.find_spec(m) is None]


async def bench_engines(report: Report) -> None:
    """The durable engines' rows for the refund story: :data:`agentlab.bench.figures.ENGINE_AGENTS` x
    :data:`agentlab.lab.yardstick.ENGINE_FAULTS`, :data:`agentlab.bench.figures.ENGINE_EPISODES` episodes a cell
    (1 with --quick), a cell's episodes at once (they mostly wait: Temporal's retry timers, the stuck run's cap), the
    fault-free ones one at a time with their costs counted on the wire; the table's wall time is
    ``engines_table_s``, its violations,
    the engines' verdicts and the costs per tool call go to the notes. Without an engine the section says which
    to install and measures nothing."""
    from agentlab.bench.figures import ENGINE_AGENTS, ENGINE_EPISODES
    from agentlab.lab.yardstick import ENGINE_FAULTS
    from agentlab.lab.yardstick_table import run_yardstick

    if missing := engines_missing():
        report.notes["engines"] = {"skipped": f"not installed: {', '.join(missing)} "
                                              "(pip install -r requirements-engines.txt)"}
        return
    episodes = ENGINE_EPISODES if report.mode.name == "full" else 1
    t0 = time.perf_counter()
    result = await run_yardstick(ENGINE_AGENTS, ENGINE_FAULTS, episodes=episodes, costs=True, progress=False,
                                 episodes_at_once=episodes)
    report.add("engines_table_s", time.perf_counter() - t0)
    summary, costs = result.summary, result.costs()
    report.notes["engines"] = {
        "episodes_per_cell": episodes, "episodes_at_once": episodes,
        "violations": {a: {f: summary.loc[f, a] for f in result.faults} for a in result.agents},
        "verdicts": {f"{agent} x {fault}": said for (fault, agent), said in result.engine_verdicts().items()},
        "costs_per_tool_call": {a: {c: (None if costs.loc[a, c] != costs.loc[a, c] else float(costs.loc[a, c]))
                                    for c in costs.columns} for a in costs.index},
    }


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

