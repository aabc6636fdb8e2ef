"""The bench's report: what one run measured, its ratios and goals, where it ran, and its text table.

A :class:`Report` holds one :class:`Figure` per measured name of :data:`agentlab.bench.figures.FIGURES` (its
values over repeats, their median, min, max and spread in percent), the ratios of their medians
(:data:`agentlab.bench.figures.RATIOS`), the goals met or missed (:data:`agentlab.bench.figures.GOALS`), free-form
notes, and where it ran (:func:`machine`: cores, versions, event loop, load average, which server).
:func:`render` is the ``bench`` command's text table (:data:`ROWS`); :func:`say` prints a progress line to stderr.

Sources: Python docs "os.getloadavg", "importlib.metadata".
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from agentlab.bench.figures import FIGURES, GOALS, NETWORK_RTTS_MS, RATIOS, Mode, network_figure
from agentlab.runtime import db


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



def say(text: str) -> None:
    """Print ``text`` as a progress line of the bench on stderr (its JSON or table alone goes to stdout)."""
    print(f"bench: {text}", file=sys.stderr, flush=True)


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
    if "engines" in d["notes"]:
        lines += _engine_lines(d["notes"]["engines"])
    lines += ["", "goals:"]
    for name, g in d["goals"].items():
        mark = "n/a" if g["met"] is None else ("met" if g["met"] else "MISSED")
        lines.append(f"  {name:38} {str(g['value']):>10} (target {g['target']}): {mark}")
    return "\n".join(lines)


def _engine_lines(engines: dict) -> list[str]:
    """The engines' table of the ``engines`` section, as text (or the line saying why it was skipped)."""
    if "skipped" in engines:
        return [f"(the engines' rows: skipped, {engines['skipped']})"]
    agents = list(engines["violations"])
    faults = list(next(iter(engines["violations"].values())))
    width = max(len(a) for a in agents) + 2
    out = ["", f"the durable engines on the refund story, violations over {engines['episodes_per_cell']} episode(s) "
           "a cell, then the costs per tool call (fault-free episodes):",
           " " * 24 + "".join(f"{a:>{width}}" for a in agents)]
    out += [f"{f:24}" + "".join(f"{str(engines['violations'][a][f]):>{width}}" for a in agents) for f in faults]
    for cost in ("wall_ms_per_call", "round_trips_per_call"):
        out.append(f"{cost:24}" + "".join(f"{str(engines['costs_per_tool_call'][a].get(cost)):>{width}}"
                                          for a in agents))
    out += [f"  {cell}: {', '.join(said)}" for cell, said in engines["verdicts"].items()]
    return out

