"""What the bench measures: its figures and their units, the ratios and goals read from them, and how much.

- :data:`FIGURES`: figure name -> unit (``ms``, ``episodes/s``, ``s``, ``B``, ``MB``, ``round trips``,
  ``processes``, ``episodes``); :data:`TAU2_FIGURES` are the tau2 section's (``--quick`` leaves them out).
- :data:`RATIOS`: ratio name -> (numerator figure, denominator figure), read on their medians.
- :data:`GOALS`: goal name -> (figure or ratio, comparison, target): the issue's targets.
- :class:`Mode` (:data:`QUICK`, :data:`FULL`): repeats, batches and episodes per section.
- The workshop experiment (:data:`WORKSHOP_PRESETS` x :data:`WORKSHOP_FAULTS`, :data:`WORKSHOP_EPISODES` per
  cell, at :data:`CONCURRENCY_LEVELS`) and the network section's round-trip times (:data:`NETWORK_RTTS_MS`, ms;
  its figures are named by :func:`network_figure`).

:mod:`agentlab.bench.suite` says what each figure measures; :mod:`agentlab.bench.sections` measures them.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentlab.core.safeguards import PRESETS
from agentlab.lab.faults import FAMILIES, FAULTS

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
    "engines_table_s": "s",
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
    "engines_refund_rows_in_5_min": ("engines_table_s", "<", 300.0),
}

ENGINE_AGENTS = ("dbos:transactions", "dbos:steps", "temporal:activities", "pydantic_ai:dbos", "pydantic_ai:temporal",
                 "kit:full")
"""The durable engines' agents the ``engines`` section measures, the kit beside them."""
ENGINE_EPISODES = 5  # per cell of the engines' table in the full mode (1 with --quick), all 5 at once

TAU2_FIGURES = ("tau2_114_full_none_s", "tau2_114_cpu_s", "tau2_114_server_cpu_s", "tau2_table_s")
ENGINE_FIGURES = ("engines_table_s",)  # the engines section's (--quick leaves it out too)
