"""C39: what a newcomer reads on the command line: plain, quick help; the kept database's URL in one
command; replies shortened at a word boundary with a mark; each block under its header."""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys

import psycopg
import pytest

from agentlab.demos.report import SHORTENED_MARK, shorten
from agentlab.runtime import db


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentlab", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=180)


@pytest.mark.parametrize("command", [[], ["demo"], ["chaos"], ["bench"], ["db"]])
def test_c39_help_is_plain_text_and_quick(command):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = run_cli(*command, "--help")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert proc.returncode == 0, proc.stderr
    assert "``" not in proc.stdout and ":mod:" not in proc.stdout and ":func:" not in proc.stdout
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    # 0.5 to 0.8 s of CPU here (psycopg and pydantic; the machine shared), 2.0 to 2.2 s while it imported LangGraph
    assert cpu_s < 1.2, f"--help took {cpu_s:.2f} s of CPU"


def test_c39_building_the_parser_imports_no_langgraph_nor_langchain():
    code = ("import sys; from agentlab.cli.main import build_parser; build_parser().format_help(); "
            "print(sorted({m.split('.')[0] for m in sys.modules if m.startswith(('langgraph', 'langchain'))}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_c39_db_url_name_gives_that_database(database_url):
    name = db.dbname_of(database_url)
    proc = run_cli("db", "url", name)
    assert proc.returncode == 0, proc.stderr
    url = proc.stdout.strip()
    assert db.dbname_of(url) == name
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT current_database(), count(*) FROM customers").fetchone()[0] == name


def test_c39_db_url_of_an_unknown_name_is_one_line_and_exit_1():
    proc = run_cli("db", "url", "agentlab_no_such_db")
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "agentlab: there is no agentlab database named 'agentlab_no_such_db' on this server; "
        "`python -m agentlab db list` names them"]


def test_c39_demo_keep_prints_the_exact_psql_command_and_it_reaches_the_kept_data():
    proc = run_cli("demo", "--keep")
    assert proc.returncode == 0, proc.stderr
    (line,) = [ln for ln in proc.stdout.splitlines() if "look at it with" in ln]
    m = re.fullmatch(r'\s*look at it with\s+psql "\$\(python -m agentlab db url (agentlab_demo_[0-9a-f]+)\)"', line)
    assert m, line
    name = m.group(1)
    try:
        url = run_cli("db", "url", name).stdout.strip()
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT count(*) FROM refunds").fetchone()[0] == 1  # the demo's one refund
        assert "password" not in proc.stdout
    finally:
        db.drop_database(name)


def test_c39_replies_are_shortened_at_a_word_boundary_with_a_mark():
    reply = ("NOT APPLIED: another call in this batch failed, so the whole batch was rolled back. "
             "Send this call again unchanged.")
    short = shorten(reply, width=110)
    assert short.endswith(SHORTENED_MARK) and len(short) <= 110
    kept = short.removesuffix(SHORTENED_MARK)
    assert reply.startswith(kept) and reply[len(kept)] == " "  # the cut falls between two words
    assert shorten("short reply") == "short reply"
    assert shorten(None) == "(no answer)"
    blob = "x" * 300  # one word longer than the line: cut inside it, still marked
    assert shorten(blob, width=50) == "x" * (50 - len(SHORTENED_MARK)) + SHORTENED_MARK
    for width in (20, 37, 64, 110):
        text = shorten(reply, width=width)
        assert len(text) <= width
        assert reply.startswith(text.removesuffix(SHORTENED_MARK))
        assert reply[len(text.removesuffix(SHORTENED_MARK))] in " ,.;:" or len(text) == len(reply)


def test_c39_the_approval_demo_prints_its_block_under_its_header():
    proc = run_cli("demo", "--scenario", "approval")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "agentlab demo: scenario 'approval', preset 'full'"
    at = next(i for i, ln in enumerate(lines) if ln.startswith("Approval: 1 request for 2 call(s)"))
    step = next(i for i, ln in enumerate(lines) if ln.startswith("Step 1:"))
    assert 0 < at < step
    assert lines[at + 1].strip() == "QueueRefund RMA-3001 30000 cents -> reject"
    assert lines[at + 2].strip() == "QueueRefund RMA-3002 15000 cents -> approve"
