"""The bench's delay line: a real PostgreSQL server behind a TCP forwarder that holds every chunk for a fixed
one-way delay. Rows come through unchanged and in order, a round trip takes at least twice the delay, delays
do not add up over a burst, the forwarder's process is gone when the block exits (also on an exception), and
an unreachable target is named in a clear error."""

from __future__ import annotations

import socket
import threading
import time

import psutil
import psycopg
import pytest

from agentlab.bench.delay_line import DelayLineError, delay_line, through, url_target

MANY_ROWS = "SELECT g, md5(g::text) FROM generate_series(1, 20000) g ORDER BY g"  # about 0.8 MB: many chunks


def _line_processes() -> list[psutil.Process]:
    return [p for p in psutil.Process().children() if any("delay_line.py" in a for a in p.cmdline())]


def test_rows_come_through_the_line_unchanged_and_in_order(database_url):
    with psycopg.connect(database_url, autocommit=True) as conn:
        direct_customers = conn.execute("SELECT id, name, credit_cents FROM customers ORDER BY id").fetchall()
        direct_many = conn.execute(MANY_ROWS).fetchall()
    with delay_line(*url_target(database_url), one_way_delay_ms=0.5) as (host, port):
        assert host == "127.0.0.1" and port > 0
        with psycopg.connect(through(database_url, host, port), autocommit=True) as conn:
            assert conn.info.host == "127.0.0.1" and conn.info.port == port  # over TCP, through the line
            customers = conn.execute("SELECT id, name, credit_cents FROM customers ORDER BY id").fetchall()
            many = conn.execute(MANY_ROWS).fetchall()
            conn.execute("UPDATE customers SET credit_cents = credit_cents + 7 WHERE id = %s", (customers[0][0],))
    assert len(direct_customers) >= 1 and customers == direct_customers
    assert len(many) == 20000 and many == direct_many
    with psycopg.connect(database_url, autocommit=True) as conn:  # the write went through to the server
        assert conn.execute("SELECT credit_cents FROM customers WHERE id = %s",
                            (customers[0][0],)).fetchone()[0] == customers[0][2] + 7


def test_a_round_trip_through_the_line_takes_at_least_twice_the_one_way_delay(database_url):
    one_way_ms = 5.0
    with delay_line(*url_target(database_url), one_way_delay_ms=one_way_ms) as (host, port):
        with psycopg.connect(through(database_url, host, port), autocommit=True) as conn:
            conn.execute("SELECT 1")
            trips = []
            for _ in range(5):
                t0 = time.perf_counter()
                assert conn.execute("SELECT 1").fetchone() == (1,)
                trips.append((time.perf_counter() - t0) * 1000)
    assert min(trips) >= 2 * one_way_ms, trips


def test_a_burst_is_delayed_once_not_once_per_chunk(database_url):
    """Ten chunks 5 ms apart behind a 20 ms one-way delay: each echo comes back about 40 ms after it was
    sent. Holding each chunk for the delay after the one before it would put the tenth at 200 ms or more."""
    server = socket.create_server(("127.0.0.1", 0))

    def echo():  # every connection in turn: the line's first one is its check that the target answers
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # closed: the test is over
                return
            with conn:
                while data := conn.recv(65536):
                    conn.sendall(data)

    threading.Thread(target=echo, daemon=True).start()
    one_way_ms, sent, seen = 20.0, {}, {}
    with delay_line("127.0.0.1", server.getsockname()[1], one_way_delay_ms=one_way_ms) as (host, port):
        with socket.create_connection((host, port)) as c:
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            c.settimeout(5)
            for k in range(10):
                sent[k] = time.perf_counter()
                c.sendall(b"%03d" % k)
                time.sleep(0.005)
            received = b""
            while len(received) < 30:
                received += c.recv(100)
                now = time.perf_counter()
                for k in range(len(received) // 3):
                    seen.setdefault(k, now)
    server.close()
    assert received == b"".join(b"%03d" % k for k in range(10))  # in order
    latencies_ms = [(seen[k] - sent[k]) * 1000 for k in range(10)]
    assert min(latencies_ms) >= 2 * one_way_ms, latencies_ms
    assert max(latencies_ms) < 2 * one_way_ms + 60, latencies_ms  # drift would add 15 ms a chunk: 175 ms at the tenth


def test_the_line_process_is_gone_after_the_block_also_when_it_raises(database_url):
    target = url_target(database_url)
    with delay_line(*target, one_way_delay_ms=0.1) as (host, port):
        (line,) = _line_processes()
        assert line.is_running()
    assert not psutil.pid_exists(line.pid)  # ended and reaped
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, port), timeout=2)

    with pytest.raises(RuntimeError, match="the body failed"):
        with delay_line(*target, one_way_delay_ms=0.1) as (host, port):
            (line,) = _line_processes()
            raise RuntimeError("the body failed")
    assert not psutil.pid_exists(line.pid)
    assert _line_processes() == []
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, port), timeout=2)


def test_an_unreachable_target_is_a_clear_error():
    with socket.create_server(("127.0.0.1", 0)) as s:
        free_port = s.getsockname()[1]  # nothing listens there once it is closed
    with pytest.raises(DelayLineError, match=rf"127\.0\.0\.1:{free_port}: cannot reach the target "
                                             r"\(ConnectionRefusedError"):
        with delay_line("127.0.0.1", free_port, one_way_delay_ms=1):
            pytest.fail("the block ran without a target")
    with pytest.raises(DelayLineError, match=r"/nonexistent-folder/\.s\.PGSQL\.5432: cannot reach the target "
                                             r"\(FileNotFoundError"):
        with delay_line("/nonexistent-folder", 5432, one_way_delay_ms=1):
            pytest.fail("the block ran without a target")
    assert _line_processes() == []
