"""C26: a value given twice to a list option is refused by the parser, exit 2, one line naming it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agentlab.lab.experiments import run_experiment

UNREACHABLE = {"DATABASE_URL": "postgresql://postgres@127.0.0.1:1/postgres"}


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentlab", *args], capture_output=True, text=True,
                          env={**os.environ, **UNREACHABLE}, timeout=120)


@pytest.mark.parametrize("args, option, value", [
    (["chaos", "--faults", "check_violation", "check_violation", "--presets", "naive", "--episodes", "2"],
     "--faults", "check_violation"),
    (["chaos", "--faults", "none", "none", "--presets", "full", "--episodes", "1", "--json"], "--faults", "none"),
    (["chaos", "--presets", "naive", "naive"], "--presets", "naive"),
    (["chaos", "--presets", "naive", "full", "naive"], "--presets", "naive"),
    (["bench", "--only", "batch", "batch"], "--only", "batch"),
])
def test_c26_a_repeated_value_is_refused_by_the_parser_naming_it(args, option, value):
    proc = run_cli(*args)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert errors == [f"python -m agentlab {args[0]}: error: argument {option}: '{value}' is given more than once; "
                      "name each value once"]
    assert "cannot connect" not in proc.stderr  # refused before the database is even tried


def test_c26_distinct_values_still_parse():
    from agentlab.cli.main import build_parser

    args = build_parser().parse_args(["chaos", "--faults", "none", "check_violation", "--presets", "naive", "full"])
    assert args.faults == ["none", "check_violation"] and args.presets == ["naive", "full"]


@pytest.mark.parametrize("presets, faults, says", [
    (["naive", "naive"], ["none"], "preset 'naive' is given more than once"),
    (["full"], ["none", "none"], "fault 'none' is given more than once"),
])
async def test_c26_run_experiment_refuses_a_repeated_name_before_any_database(presets, faults, says):
    with pytest.raises(ValueError, match=says):
        await run_experiment(1, presets, faults, url="postgresql://postgres@127.0.0.1:1/postgres")
