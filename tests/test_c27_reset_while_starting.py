"""C27: db reset while the server is starting waits for the start, then says what it really did.

Runs its own embedded server in a private AGENTLAB_HOME (never the one the other tests share).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest


def env_for(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    return {**env, "AGENTLAB_HOME": str(home)}


def cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentlab", *args], capture_output=True, text=True,
                          env=env_for(home), timeout=300)


def servers_on(pgdata: Path) -> list[int]:
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "postgres" in cmd and str(pgdata) in cmd:
            found.append(p.info["pid"])
    return found


@pytest.fixture
def home():
    home = Path(f"/tmp/agentlab-c27-{os.getpid()}-{time.time_ns()}")  # no spaces; readable by the server's user
    home.mkdir(mode=0o755)
    yield home
    if (home / "pgdata").exists():
        cli(home, "db", "reset")


def test_c27_reset_during_initdb_waits_for_the_start_then_stops_and_removes(home):
    pgdata = home / "pgdata"
    start = subprocess.Popen([sys.executable, "-m", "agentlab", "db", "start"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env_for(home))
    deadline = time.monotonic() + 60
    while not pgdata.exists() and time.monotonic() < deadline:  # the start holds the lock and runs initdb
        time.sleep(0.02)
    assert pgdata.exists() and not (pgdata / "postmaster.pid").exists()  # mid-start, no server yet

    reset = cli(home, "db", "reset")
    out, err = start.communicate(timeout=300)

    assert reset.returncode == 0, reset.stderr
    assert reset.stdout.strip() == (f"waited for the start in progress, then stopped the embedded server and "
                                    f"removed {pgdata}; the next use starts a fresh one")
    assert "cold start (initdb)" in out, err  # the start was never cut off
    assert not pgdata.exists()
    assert servers_on(pgdata) == []  # and no server is left running


def test_c27_reset_and_stop_with_nothing_running_say_so(home):
    reset = cli(home, "db", "reset")
    assert reset.returncode == 0, reset.stderr
    assert reset.stdout.strip() == (f"no embedded server was running; there was no data folder at {home / 'pgdata'}; "
                                    "the next use starts a fresh one")
    stop = cli(home, "db", "stop")
    assert (stop.returncode, stop.stdout.strip()) == (0, "embedded server was not running")


def test_c27_stop_then_reset_of_a_running_server(home):
    assert cli(home, "db", "start").returncode == 0
    pgdata = home / "pgdata"
    assert servers_on(pgdata)
    stop = cli(home, "db", "stop")
    assert (stop.returncode, stop.stdout.strip()) == (0, "embedded server stopped")
    assert servers_on(pgdata) == []
    reset = cli(home, "db", "reset")
    assert reset.stdout.strip() == (f"no embedded server was running; removed {pgdata}; the next use starts a fresh one")
