"""The failure lab's command stopped from outside: Ctrl-C, and the database server going away.

Both run ``python -m agentlab chaos`` with worker processes on a private embedded server (its own
``AGENTLAB_HOME``), since the second test stops that server. A newcomer must get, in seconds, one
line and an exit code (130, 2), no traceback from a worker, and no database left behind by Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

CHAOS = [sys.executable, "-m", "agentlab", "chaos", "--episodes", "20", "--workers", "2"]
STOP_WITHIN_S = 30


@pytest.fixture(scope="module")
def private_server(tmp_path_factory):
    home = tmp_path_factory.mktemp("agentlab-home")
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"} | {"AGENTLAB_HOME": str(home)}
    subprocess.run([sys.executable, "-m", "agentlab", "db", "start"], env=env, check=True, capture_output=True,
                   timeout=120)
    yield env
    subprocess.run([sys.executable, "-m", "agentlab", "db", "stop"], env=env, capture_output=True, timeout=60)


def agentlab(env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentlab", *args], env=env, capture_output=True, text=True,
                          timeout=120)


def chaos_databases(env) -> list[str]:
    return [d for d in agentlab(env, "db", "list").stdout.split() if d.startswith("agentlab_chaos_")]


def start_chaos(env) -> subprocess.Popen:
    proc = subprocess.Popen(CHAOS, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own process group, as a terminal's job
    deadline = time.monotonic() + 60
    while not chaos_databases(env):  # running: its database exists
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "chaos never created its database"
        time.sleep(0.2)
    time.sleep(4)  # the workers are started and running episodes
    return proc


def finish(proc: subprocess.Popen) -> tuple[int, str, float]:
    t0 = time.monotonic()
    try:
        _, err = proc.communicate(timeout=STOP_WITHIN_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"chaos still running {STOP_WITHIN_S} s later")
    return proc.returncode, err, time.monotonic() - t0


def test_ctrl_c_stops_the_workers_and_drops_the_database(private_server):
    env = private_server
    proc = start_chaos(env)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground group gets SIGINT
    code, err, _ = finish(proc)

    assert code == 130
    assert err.strip() == "agentlab: interrupted"  # no worker traceback
    assert chaos_databases(env) == []


def test_a_stopped_server_ends_the_run_with_one_line_and_exit_2(private_server):
    env = private_server
    proc = start_chaos(env)
    assert agentlab(env, "db", "stop").returncode == 0
    code, err, _ = finish(proc)

    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert lines[0].startswith("agentlab: lost the database server during the run")
    assert "python -m agentlab db start" in lines[0]


def test_ctrl_c_while_python_loads_the_command_line_prints_one_line_and_exits_130(tmp_path):
    # a Ctrl-C that lands while `python -m agentlab` imports its own command line (the first ~50 ms): made
    # certain here by an import hook that raises KeyboardInterrupt when agentlab.cli.main is imported
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'agentlab.cli.main':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, Interrupt())\n")
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "agentlab", "db", "list"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert (done.returncode, done.stderr, done.stdout) == (130, "agentlab: interrupted\n", "")
