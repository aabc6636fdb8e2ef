"""Experiments and the chaos CLI: the whole matrix once, the full preset holds, each safeguard buys
something, the same seed gives the same table, and the CLI's JSON and heatmap."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentlab.__main__ import main
from agentlab.core.safeguards import preset
from agentlab.lab.experiments import LADDER, ROW_COLUMNS, run_experiment
from agentlab.lab.faults import FAULTS
from agentlab.lab.invariants import KINDS

FAST_FAULTS = ["none", "wrong_type", "stray_quote", "check_violation", "backend_killed", "crash_before_checkpoint",
               "crash_mid_node", "provider_timeout", "worker_crash", "wrong_order"]


def guarded_here(fault: str) -> bool:
    """Whether this build has the safeguard the fault needs (tenant isolation arrives with its own switch)."""
    needs_isolation = FAULTS[fault].guarded_by.startswith("isolation")
    return not needs_isolation or hasattr(preset("full"), "isolation")


@pytest.fixture(scope="module")
def matrix():
    """Every fault under every preset, one episode each (about 120 episodes)."""
    return asyncio.run(run_experiment(1, seed=3, concurrency=16, progress=False))


def test_the_matrix_has_one_row_per_episode_and_no_error(matrix):
    assert len(matrix.rows) == len(FAULTS) * len(LADDER) == matrix.episodes
    assert list(matrix.rows.columns) == list(ROW_COLUMNS)
    assert matrix.rows["error"].isna().all(), matrix.rows.loc[matrix.rows["error"].notna(), ["fault", "preset", "error"]]
    assert (matrix.rows["violations"] == matrix.rows[list(KINDS)].sum(axis=1)).all()


def test_the_full_preset_has_no_violation_for_any_fault(matrix):
    full = matrix.summary["full"]
    assert all(full[f] == 0 for f in full.index if guarded_here(f)), full[full > 0]


def test_the_checker_can_fail_the_naive_preset_breaks(matrix):
    assert matrix.summary["naive"].sum() > 0
    assert matrix.summary.loc["none"].sum() == 0  # the control row holds everywhere


def test_each_safeguard_buys_something(matrix):
    effects = matrix.safeguard_effects()
    for rung in LADDER[1:]:
        assert (effects["safeguard"] == rung).any(), f"nothing drops to 0 at {rung}"


@pytest.mark.parametrize("rung, fault, kind", [
    ("constraints", "check_violation", "negative_balance"),
    ("validated", "wrong_type", "balance_mismatch"),
    ("transaction", "backend_killed", "unreported_effect"),
    ("savepoints", "wrong_order", "half_applied_batch"),
    ("ledger", "crash_before_checkpoint", "unreported_effect"),
    ("full", "provider_timeout", "payment_count"),
])
def test_the_safeguard_holds_the_fault_it_is_meant_for(matrix, rung, fault, kind):
    by_kind = matrix.by_kind()
    below = LADDER[LADDER.index(rung) - 1]
    assert by_kind.loc[(fault, below), kind] > 0
    assert by_kind.loc[(fault, rung), kind] == 0


def test_same_seed_same_table():
    first = asyncio.run(run_experiment(2, faults=FAST_FAULTS, seed=11, concurrency=12, progress=False))
    second = asyncio.run(run_experiment(2, faults=FAST_FAULTS, seed=11, concurrency=5, progress=False))
    assert first.summary.equals(second.summary)
    assert first.deterministic_view().equals(second.deterministic_view())


def test_chaos_cli_json_and_heatmap(tmp_path, capsys):
    png = tmp_path / "chaos.png"
    code = main(["chaos", "--episodes", "1", "--faults", "none", "check_violation", "--presets", "naive", "full",
                 "--seed", "1", "--concurrency", "4", "--json", "--plot", str(png)])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"episodes", "wall_s", "summary", "rows"}
    assert out["episodes"] == 4 and len(out["rows"]) == 4
    assert out["summary"]["naive"]["check_violation"] > 0
    assert out["summary"]["full"] == {"none": 0, "check_violation": 0}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_chaos_cli_prints_the_table(capsys):
    assert main(["chaos", "--episodes", "1", "--faults", "negative_amount", "--presets", "constraints", "validated",
                 "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "negative_amount" in text and "validated" in text and "episodes/s" in text
    assert "validated" in text.split("What each safeguard buys")[1]


def test_a_custom_safeguards_value_runs_beside_the_presets():
    """Users build their own: the full preset without its outbox double-charges on a provider timeout."""
    no_outbox = preset("full").replace(name="full_without_outbox", outbox=False)
    result = asyncio.run(run_experiment(1, ["full", no_outbox], ["provider_timeout"], concurrency=2, progress=False))
    assert result.summary.loc["provider_timeout", "full"] == 0
    assert result.summary_of(["payment_count"]).loc["provider_timeout", "full_without_outbox"] == 1


def test_worker_processes_give_the_same_rows_as_one_process():
    faults = ["none", "check_violation", "crash_before_checkpoint", "provider_timeout", "statement_timeout"]
    one = asyncio.run(run_experiment(1, ["transaction", "full"], faults, seed=5, concurrency=4, progress=False))
    two = asyncio.run(run_experiment(1, ["transaction", "full"], faults, seed=5, concurrency=4, progress=False,
                                     workers=2))
    assert (one.workers, two.workers) == (1, 2)
    assert one.deterministic_view().equals(two.deterministic_view())
    assert two.rows["error"].isna().all()


def test_a_workers_to_thread_calls_run_inline_and_raise_as_in_a_thread():
    import threading

    from agentlab.lab.parallel import InlineExecutor

    async def main():
        asyncio.get_running_loop().set_default_executor(InlineExecutor(max_workers=1))
        assert await asyncio.to_thread(threading.get_ident) == threading.get_ident()
        with pytest.raises(ZeroDivisionError):
            await asyncio.to_thread(lambda: 1 / 0)

    asyncio.run(main())
