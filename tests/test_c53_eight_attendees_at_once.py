"""C53 for a room: eight attendees run a notebook in eight kernels at the same moment against one server, each
kernel under its attendee's role and budget (``DATABASE_URL`` naming the attendee, ``AGENTLAB_MAX_CONNECTIONS``
as ``room setup`` prints it), as a JupyterHub spawner starts them. Every run ends green, every database a kernel
works in belongs to its attendee, and the room's connections stay within the budgets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentlab.core import budget
from agentlab.runtime import db, room
from tests.room import ROOT, RoomActivity, shared_room_of

ATTENDEES = 8
BUDGET = 10  # each attendee role's CONNECTION LIMIT, room setup's default
# The quickest notebook that opens the harness and runs an episode: 5-10 s alone under nbconvert, as 01 is;
# 00 also makes and drops a database of its own (the setup check), and its kernel is the smaller (177 MB).
NOTEBOOK = ROOT / "notebooks" / "00_setup.ipynb"
DEADLINE_S = 600.0  # all eight runs, together: a hung kernel fails the test instead of holding the suite


def _start(shared, n: int, app: str, out: Path) -> subprocess.Popen:
    """``jupyter nbconvert --execute`` of :data:`NOTEBOOK` as attendee ``n``, its copy and log in ``out``."""
    env = {**os.environ, db.ENV_VAR: shared.url(n), budget.ENV_VAR: str(room.kernel_budget(BUDGET)),
           "PGAPPNAME": app, "PYTHONPATH": str(ROOT)}
    out.mkdir()
    with (out / "nbconvert.log").open("w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "jupyter", "nbconvert", "--execute", "--to", "notebook", "--output-dir", str(out),
             f"--ExecutePreprocessor.timeout={int(DEADLINE_S)}",
             # the kernel's channels as sockets in the attendee's own folder, not TCP ports: eight clients picking
             # free ports at once can pick the same one (a kernel then dies before replying to kernel_info)
             "--KernelManager.transport=ipc", f"--KernelManager.ip={out / 'kernel'}", str(NOTEBOOK)],
            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=out)


def _wait_all(runs: dict[int, subprocess.Popen], deadline_s: float) -> dict[int, int | None]:
    """Each run's exit code, waiting on each process's end; None for those still running at the deadline
    (then killed: nbconvert's kernel exits with its parent)."""
    give_up, codes = time.monotonic() + deadline_s, {}
    for n, proc in runs.items():
        try:
            codes[n] = proc.wait(timeout=max(0.0, give_up - time.monotonic()))
        except subprocess.TimeoutExpired:
            codes[n] = None
    for proc in runs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return codes


def _cell_errors(out: Path) -> list[str]:
    """``ename: evalue`` of every error output in the executed copy (none when it was not written)."""
    copy = out / NOTEBOOK.name
    if not copy.exists():
        return [f"no executed copy at {copy}"]
    cells = json.loads(copy.read_text())["cells"]
    return [f"{o['ename']}: {o['evalue']}" for c in cells for o in c.get("outputs", []) if o["output_type"] == "error"]


@pytest.mark.slow
def test_c53_eight_attendees_run_a_notebook_at_once_within_their_budgets(monkeypatch, tmp_path):
    with shared_room_of(ATTENDEES, monkeypatch, budget=BUDGET) as shared:
        apps = {n: f"{shared.prefix}{n}_run" for n in range(1, ATTENDEES + 1)}
        limits = dict(shared.query("SELECT rolname, rolconnlimit FROM pg_roles WHERE rolname = ANY(%s)",
                                   ([shared.role(n) for n in apps],)))
        started = time.perf_counter()
        with RoomActivity(shared.admin, apps=tuple(apps.values())) as seen:
            runs = {n: _start(shared, n, app, tmp_path / f"attendee{n}") for n, app in apps.items()}
            codes = _wait_all(runs, DEADLINE_S)
        wall_s = time.perf_counter() - started
        left = shared.query("SELECT pg_get_userbyid(datdba), datname FROM pg_database "
                            "WHERE pg_get_userbyid(datdba) = ANY(%s)", ([shared.role(n) for n in apps],))

    per_attendee = {n: seen.peaks.get(app, 0) for n, app in apps.items()}
    as_role = {n: seen.role_peaks.get((app, shared.role(n)), 0) for n, app in apps.items()}
    figures = (f"{ATTENDEES} attendees at once, notebook {NOTEBOOK.name}: {wall_s:.0f} s; peak {seen.peak} connections "
               f"together (bound {ATTENDEES} x {BUDGET}), per attendee {per_attendee} (kernel budget "
               f"{room.kernel_budget(BUDGET)}), of those as the attendee role {as_role} (role limit {BUDGET}); "
               f"{seen.together} kernels connected in one sample, {seen.samples} samples")
    print(f"\n{figures}")

    for n, code in codes.items():
        log = (tmp_path / f"attendee{n}" / "nbconvert.log").read_text()
        assert code == 0, f"attendee {n}: nbconvert ended with {code}\n{log[-3000:]}\n{figures}"
        assert _cell_errors(tmp_path / f"attendee{n}") == [], f"attendee {n}\n{figures}"
    for n, app in apps.items():
        owners = {owner for seen_app, _, owner in seen.databases if seen_app == app}
        assert owners == {shared.role(n)}, f"attendee {n} worked in databases of {owners}\n{figures}"
    assert left == [], "the kernels' last cells drop their databases"
    assert seen.together > 1, f"the runs never overlapped\n{figures}"
    assert seen.samples > 0 and 0 < seen.peak <= ATTENDEES * BUDGET, figures
    assert all(0 < peak <= room.kernel_budget(BUDGET) for peak in per_attendee.values()), figures
    assert all(0 < as_role[n] <= limits[shared.role(n)] for n in apps), figures
