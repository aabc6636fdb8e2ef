"""C28: no part of a password in any line the command line prints or logs; an unparseable URL is not echoed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agentlab.core.redact import redact
from agentlab.runtime.db import safe_dsn


def run_cli(*args: str, url: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentlab", *args], capture_output=True, text=True,
                          env={**os.environ, "DATABASE_URL": url}, timeout=120)


@pytest.mark.parametrize("url, secrets", [
    (r"host=127.0.0.1 port=5499 user=postgres password=s3cr3t\ x", ["s3cr3t", "*** x", r"\ x"]),
    (r"host=127.0.0.1 port=5499 user=postgres password='s3cr3t it\'s'", ["s3cr3t", "it's", "it\\'s"]),
    ("postgresql://postgres:s3cr3t%20x@127.0.0.1:5499/postgres", ["s3cr3t", "%20x"]),
    ("notaurl Sup3rSecret", ["Sup3rSecret", "notaurl"]),
])
@pytest.mark.parametrize("command", [["demo"], ["-v", "demo"], ["db", "start"]])
def test_c28_no_part_of_a_password_in_any_printed_or_logged_line(url, secrets, command):
    proc = run_cli(*command, url=url)
    assert proc.returncode == 2, proc.stderr
    out = proc.stdout + proc.stderr
    for secret in secrets:
        assert secret not in out, out
    assert "Traceback" not in out
    assert len(proc.stderr.strip().splitlines()) == 1  # one line says what is wrong


def test_c28_an_unparseable_url_is_reported_without_echoing_it():
    proc = run_cli("demo", url="notaurl Sup3rSecret")
    assert proc.stderr.strip() == (
        "agentlab: DATABASE_URL is not a PostgreSQL connection string (its value is not shown: it may hold a "
        "password); it should look like postgresql://user:password@host:5432/postgres")


@pytest.mark.parametrize("text, shown", [
    (r"host=h password=s3cr3t\ x user=u", "host=h password=*** user=u"),
    (r"password='it\'s a secret' user=u", "password=*** user=u"),
    (r"password=a\\b c", "password=*** c"),  # an escaped backslash, then the next parameter
    ("PASSWORD = x y", "PASSWORD = *** y"),
    ("password=ab'cd efg", "password=*** efg"),
])
def test_c28_redact_takes_the_whole_libpq_value(text, shown):
    assert redact(text) == shown


@pytest.mark.parametrize("url, shown", [
    (r"host=127.0.0.1 port=5499 user=postgres password=s3cr3t\ x", "user=postgres password=*** host=127.0.0.1 port=5499"),
    ("postgresql://postgres:p%40ss@localhost:5432/postgres?sslmode=disable",
     "postgresql://postgres:***@localhost:5432/postgres?sslmode=disable"),
    ("postgresql://u@h/db", "postgresql://u@h/db"),
    ("notaurl Sup3rSecret", "(not shown: it does not parse)"),
])
def test_c28_safe_dsn_parses_then_masks(url, shown):
    assert safe_dsn(url) == shown
