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
- the durable engines' rows for the refund story (DBOS, Temporal, Pydantic AI on DBOS, the kit beside them; every
  engine fault, 5 episodes a cell, the costs per tool call counted on the wire), skipped with the install line
  without the optional engines;
- peak memory of this process and of the largest child (a worker of the experiment).

Every figure is measured on a fresh database of its own, committing with ``synchronous_commit = off``
(as the chaos command's does): a commit's fsync is the disk's time, not the code's, and on a shared
disk it varies more than anything measured here. :data:`GOALS` are the issue's targets; the report says
which are met. Nothing here is asserted: the figures are printed.

This module runs the sections in order (:func:`run_bench`) and is the ``bench`` command; the names of the
figures, ratios, goals and modes live in :mod:`agentlab.bench.figures`, the sections that measure them in
:mod:`agentlab.bench.sections`, the report and its text table in :mod:`agentlab.bench.report` (each name
stays importable from here).

Sources: PostgreSQL docs "synchronous_commit"; Python docs "resource.getrusage".
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace

from agentlab.bench.figures import (  # noqa: F401 (their home moved to agentlab.bench.figures; importable here)
    CONCURRENCY_LEVELS,
    FIGURES,
    FULL,
    GOALS,
    NETWORK_GOAL_RTT_MS,
    NETWORK_RTTS_MS,
    NETWORK_WARM_ROUNDS,
    QUICK,
    RATIOS,
    TAU2_FIGURES,
    WORKSHOP_EPISODES,
    WORKSHOP_FAULTS,
    WORKSHOP_PRESETS,
    Mode,
    network_figure,
)
from agentlab.bench.report import ROWS, Figure, Report, machine, render, say  # noqa: F401 (home: bench.report)
from agentlab.bench.sections import (  # noqa: F401 (their home moved to agentlab.bench.sections; importable here)
    SERVER_START,
    TAU2_TABLE_CONCURRENCY,
    bench_batch,
    bench_checkpoints,
    bench_engines,
    bench_episodes,
    bench_memory,
    bench_network,
    bench_server,
    bench_tau2,
    bench_workshop,
    network_2x_from,
    two_core_ceiling,
)
from agentlab.core.safeguards import PRESETS  # noqa: F401 (importable from here as before)
from agentlab.lab.faults import FAMILIES, FAULTS  # noqa: F401 (importable from here as before)
from agentlab.runtime import db  # noqa: F401 (importable from here as before)

SECTIONS = ("batch", "network", "episodes", "workshop", "server", "checkpoints", "tau2", "engines")
QUICK_SECTIONS = SECTIONS[:-2]  # --quick leaves tau2 and the engines out (minutes); --quick --only NAME measures one


async def run_bench(mode: Mode = QUICK, sections: tuple[str, ...] = SECTIONS) -> Report:
    """Measure ``sections`` (all by default) in ``mode``; return the report. Progress goes to stderr."""
    report = Report(mode)
    steps = {"batch": ("the tools node's batch against plain psycopg", bench_batch),
             "network": ("the same batches behind a TCP delay line, per round-trip time", bench_network),
             "episodes": ("full-safety episodes against no-op tools, per checkpointer", bench_episodes),
             "workshop": ("the workshop experiment, at concurrency 1 and the best level", bench_workshop),
             "server": ("the embedded server's cold, warm and attach start", bench_server),
             "checkpoints": ("checkpoint bytes per super-step, before and after retention", bench_checkpoints),
             "tau2": ("tau2-bench retail: 114 tasks under full, and the whole table", bench_tau2),
             "engines": ("the durable engines' rows for the refund story, costs counted", bench_engines)}
    for name in sections:
        title, fn = steps[name]
        say(f"{title} ...")
        t0 = time.perf_counter()
        result = fn(report)
        if asyncio.iscoroutine(result):
            await result
        else:
            await asyncio.sleep(0)
        say(f"  done in {time.perf_counter() - t0:.1f} s")
    bench_memory(report)
    return report


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
