"""A Temporal agent (an activity per tool, as Temporal's documentation writes one) under the lab's faults, each
worker a real process on the episode's task queue of a dev server the lab started: what the database and the
provider hold, what the kit's checker reports, and what Temporal says.

A crash here is a worker that exits (``os._exit(99)``) right after the deduction's activity committed and before
it reported the completion; a new worker on the same queue is handed the activity again after its 3 s
start-to-close timeout. The engine is an optional install: without it this file skips, with the line that
installs it."""

from __future__ import annotations

import pytest

pytest.importorskip("temporalio", reason="Temporal is an optional install: pip install -r requirements-engines.txt")

from agentlab.lab.clients import temporal_server  # noqa: E402 (after the skip)


def test_the_dev_server_retries_on_a_port_taken_in_between_and_stops_cleanly(monkeypatch):
    import socket

    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        taken = [blocker.getsockname()[1]]
        pick = temporal_server.free_port
        monkeypatch.setattr(temporal_server, "free_port", lambda: taken.pop() if taken else pick())
        server = temporal_server.DevServer().start()
        try:
            port, workdir = server.port, server.workdir
            assert port != blocker.getsockname()[1] and temporal_server.listens(server.process.pid, port)
        finally:
            server.stop()
    assert not temporal_server.accepts(port)
    assert server.process is None and not __import__("os").path.exists(workdir)
