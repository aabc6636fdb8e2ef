"""Peak connections of notebooks run as one attendee, for the room plan (instructor/ROOM.md).

    python scripts/room_peaks.py ADMIN_URL ATTENDEE_URL BUDGET notebooks/09_failure_lab.ipynb ...

Each notebook runs under ``jupyter nbconvert --execute`` with ``DATABASE_URL=ATTENDEE_URL``,
``AGENTLAB_MAX_CONNECTIONS=BUDGET`` (``-`` leaves it unset) and a ``PGAPPNAME`` of its own; ``pg_stat_activity`` is
read every 25 ms on ADMIN_URL (a superuser's) for sessions with that name. One line per notebook: peak, seconds,
exit code.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg


def measure(admin: str, attendee: str, budget: str, notebook: str) -> tuple[int, float, int]:
    app = f"peak_{secrets.token_hex(3)}"
    env = {**os.environ, "DATABASE_URL": attendee, "PGAPPNAME": app}
    env.pop("AGENTLAB_MAX_CONNECTIONS", None)
    if budget != "-":
        env["AGENTLAB_MAX_CONNECTIONS"] = budget
    peak, stop = [0], threading.Event()

    def poll() -> None:
        with psycopg.connect(admin, autocommit=True) as conn:
            while not stop.wait(0.025):
                n = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (app,)).fetchone()[0]
                peak[0] = max(peak[0], n)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--execute", "--to", "notebook",
                               "--output-dir", out, "--ExecutePreprocessor.timeout=1800", str(Path(notebook).resolve())],
                              env=env, capture_output=True, text=True, cwd=Path(notebook).resolve().parent)
    stop.set()
    watcher.join()
    if done.returncode:
        sys.stderr.write(done.stderr[-3000:])
    return peak[0], time.perf_counter() - t0, done.returncode


if __name__ == "__main__":
    admin_url, attendee_url, budget_value, *notebooks = sys.argv[1:]
    for nb in notebooks:
        top, seconds, rc = measure(admin_url, attendee_url, budget_value, nb)
        print(f"{Path(nb).name}\tbudget {budget_value}\tpeak {top}\t{seconds:.0f} s\texit {rc}", flush=True)
