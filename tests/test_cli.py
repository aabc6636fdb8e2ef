"""The README's commands as a user runs them: the demo under both presets, and clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentlab", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120)


def demo_json(*args: str) -> dict:
    proc = run_cli("demo", "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def only_balance(rep: dict) -> dict:
    (balance,) = rep["balance_cents"].values()
    return balance


def test_demo_refund_full_refunds_once_after_a_rollback():
    rep = demo_json()
    assert (rep["scenario"], rep["preset"]) == ("refund", "full")
    assert rep["credit_memos"] == 1
    balance = only_balance(rep)
    assert balance["final"] == balance["opening"] - 2500  # one deduction
    assert rep["provider_refunds"] == 1 and rep["provider_charges"] == 0
    assert rep["rollbacks"] >= 1
    assert rep["unanswered_tool_calls"] == 0 and rep["tool_messages"] == rep["tool_calls"]
    first = rep["steps"][0]["calls"]
    assert [c["outcome"] for c in first] == ["not_applied", "not_applied", "failed"]
    assert "'customer_id'" in first[2]["reply"]


def test_demo_refund_naive_doubles_the_memo_and_the_deduction():
    rep = demo_json("--preset", "naive")
    assert rep["credit_memos"] == 2
    balance = only_balance(rep)
    assert balance["final"] == balance["opening"] - 2 * 2500
    assert rep["rollbacks"] == 0 and rep["unanswered_tool_calls"] == 0
    assert "InvalidTextRepresentation" in rep["steps"][0]["calls"][2]["reply"]  # the raw error the model saw


def test_demo_invoice_charges_once():
    rep = demo_json("--scenario", "invoice")
    assert rep["invoices"] == 1 and rep["provider_charges"] == 1
    assert only_balance(rep)["final"] == 0
    assert rep["rollbacks"] == 1 and rep["unanswered_tool_calls"] == 0


def test_demo_text_account_names_each_step():
    proc = run_cli("demo")
    assert proc.returncode == 0, proc.stderr
    assert "Step 1: the model sends 3 tool call(s)" in proc.stdout
    assert "batch rolled back" in proc.stdout and "provider refunds  1" in proc.stdout


@pytest.mark.parametrize("command", [["demo"], ["db", "url"], ["db", "start"]])
def test_unreachable_database_url_is_one_clear_line_and_exit_code_2(command):
    proc = run_cli(*command, env={"DATABASE_URL": "postgresql://postgres:pw@127.0.0.1:1/postgres"})
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert lines[0].startswith("agentlab: cannot connect to DATABASE_URL")
    assert "docker compose up -d" in lines[0] and "pw@" not in lines[0]


def test_unknown_preset_is_refused_by_the_parser():
    proc = run_cli("demo", "--preset", "bogus")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


@pytest.mark.parametrize("args, says", [
    (["--episodes", "0"], "--episodes: must be at least 1, got 0"),
    (["--concurrency", "-3"], "--concurrency: must be at least 1, got -3"),
    (["--workers", "two"], "--workers: expected a whole number, got 'two'"),
    (["--plot", "/no/such/folder/heatmap.png"], "does not exist; create it first"),
    (["--plot", "heatmap.pdf"], "is not a .png file name"),
    (["--plot", "/tmp"], "is a folder; give a file name"),
])
def test_chaos_refuses_bad_options_before_any_episode(args, says):
    proc = run_cli("chaos", *args, env={"DATABASE_URL": "postgresql://postgres@127.0.0.1:1/postgres"})
    # exit 2 from the parser, before the (unreachable) database is even tried
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr and "cannot connect" not in proc.stderr


def test_chaos_plot_into_a_read_only_folder_is_refused_up_front(tmp_path):
    if os.geteuid() == 0:
        folder = "/proc"  # root may write anywhere else; /proc takes no new file even from root
    else:
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(0o500)
    proc = run_cli("chaos", "--plot", f"{folder}/heatmap.png",
                   env={"DATABASE_URL": "postgresql://postgres@127.0.0.1:1/postgres"})
    assert proc.returncode == 2 and "cannot write" in proc.stderr and "heatmap.png" in proc.stderr


def test_a_workflow_demo_refuses_a_preset_it_would_ignore():
    proc = run_cli("demo", "--scenario", "saga", "--preset", "naive")
    assert proc.returncode == 2 and "always runs under full" in proc.stderr
