"""The bring-your-own-tool example (``examples/payouts.py``) runs from the command line as the README says,
and prints its fault x preset table: its own invariant breaks under a weak preset and holds under ``full``."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_chaos_runs_the_example_domain_from_the_command_line():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-m", "agentlab", "chaos", "--domain", "examples.payouts:DOMAIN", "--episodes", "2",
         "--presets", "savepoints", "ledger", "full", "--json"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    rows = out["rows"]
    assert {r["fault"] for r in rows} == {"none", "backend_killed", "crash_before_checkpoint", "crash_mid_node"}
    by = {}
    for r in rows:
        by[(r["fault"], r["preset"])] = by.get((r["fault"], r["preset"]), 0) + r["violations"]
    assert all(n == 0 for (fault, preset), n in by.items() if preset == "full")
    assert by[("none", "savepoints")] == 0
    # paid inline without the outbox, a killed backend rolls the payout back after the provider paid it
    assert sum(r["paid_as_meant"] for r in rows if r["fault"] == "backend_killed" and r["preset"] == "ledger") > 0


def test_an_unknown_domain_is_refused_with_one_line():
    proc = subprocess.run([sys.executable, "-m", "agentlab", "chaos", "--domain", "examples.nope:DOMAIN"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("agentlab chaos: cannot import the domain module 'examples.nope'")
    assert "Traceback" not in proc.stderr
