"""``python -m agentlab demo --domain ...``: a domain other than billing plays one of its own scenarios, and a
domain that lacks what a demo needs is refused in one line before any database is made."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from agentlab.runtime import db

REPO = Path(__file__).resolve().parents[1]


def run_cli(*args: str, cwd: Path = REPO, path: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(path), env.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-m", "agentlab", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300, check=False)


def test_the_payouts_example_plays_its_own_scenario_and_its_invariant_holds():
    proc = run_cli("demo", "--domain", "examples.payouts:DOMAIN", "--json", "--keep")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    try:
        assert (rep["domain"], rep["scenario"], rep["preset"]) == ("payouts", "payday", "full")
        assert rep["violations"] == []
        assert [c["outcome"] for step in rep["steps"] for c in step["calls"]] == ["applied", "applied"]
        assert rep["outbox"]["dispatched"] == 2
        with psycopg.connect(rep["database"], autocommit=True) as conn:  # read back from the kept database
            payouts = conn.execute("SELECT reference, amount_cents FROM payouts.payout ORDER BY reference").fetchall()
            balance = conn.execute("SELECT balance_cents FROM payouts.account").fetchall()
            paid = conn.execute("SELECT count(*) FROM provider.payments WHERE reference LIKE 'payout:%'").fetchone()[0]
        assert payouts == [("INV-1", 2500), ("INV-2", 1500)]
        assert balance == [(10_000 - 4000,)]
        assert paid == 2
    finally:
        db.drop_database(rep["database"])


def test_the_text_account_names_the_domain_and_the_invariants():
    proc = run_cli("demo", "--domain", "examples.payouts:DOMAIN", "--preset", "naive")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "agentlab demo: domain 'payouts', scenario 'payday', preset 'naive'"
    assert "Invariants (read from the database and the provider): all hold" in lines


@pytest.mark.slow
def test_retail_plays_a_tau2_task_through_the_node():
    from agentlab.domains.retail import DOMAIN

    proc = run_cli("demo", "--domain", "retail", "--scenario", "tau2-1", "--json")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert (rep["domain"], rep["scenario"]) == ("retail", "tau2-1")
    assert rep["violations"] == [] and rep["error"] is None
    planned = [call.tool for step in DOMAIN.scenarios["tau2-1"].steps for call in step]
    assert [c["tool"] for step in rep["steps"] for c in step["calls"]] == planned
    assert {c["outcome"] for step in rep["steps"] for c in step["calls"]} == {"applied"}


def test_a_domain_without_scenarios_is_refused_in_one_line(tmp_path):
    (tmp_path / "bare_domain.py").write_text(
        "from agentlab import Domain, Toolset\n"
        "DOMAIN = Domain('bare', toolset=Toolset([]), scenarios={}, create_rows=None)\n")
    proc = run_cli("demo", "--domain", "bare_domain:DOMAIN", cwd=tmp_path, path=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        ("agentlab demo: domain 'bare' has no scenarios: a demo plays one of the domain's own "
         "(give it Domain(scenarios={name: Scenario(...)}))")]


def test_an_unknown_scenario_or_domain_is_refused_in_one_line():
    proc = run_cli("demo", "--domain", "retail", "--scenario", "refund")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == ("agentlab demo: domain 'retail' has no scenario 'refund' (its scenarios: "
                                   "tau2-0, tau2-1, tau2-2, tau2-3, tau2-4, tau2-5, ... (114 in all))")
    proc = run_cli("demo", "--domain", "examples.nowhere:DOMAIN")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "agentlab demo: cannot import the domain module 'examples.nowhere': No module named 'examples.nowhere'"]
