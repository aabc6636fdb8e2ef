#!/usr/bin/env python3
"""Replay all 114 tau2 retail tasks through the PostgreSQL port and compare with tau2's end states.

A maintainer check (the test suite replays a sample; ``RETAIL_FULL=1 pytest tests/test_retail_port.py``
replays all of them too). On a fresh database of the kit's server: ``schema.sql``, ``db.json`` by
COPY, then every task's golden actions, each in its own transaction, inside a per-task transaction
that is rolled back; the canonical hash of the exported state, the actions that raised and each
action's return value are compared with ``data/retail/expected_hashes.json``.

    python scripts/retail_replay_check.py            # exit 0 when all tasks match
    python scripts/retail_replay_check.py --fix-last-variant-bug   # which tasks tau2's bug touches
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's agentlab

import psycopg  # noqa: E402

from agentlab import create_database, drop_database  # noqa: E402
from agentlab.domains.retail.load import create_schema, load, read_db_json  # noqa: E402
from agentlab.domains.retail.replay import check_tasks  # noqa: E402


async def run(fix_bug: bool) -> int:
    url = create_database("retail_check")
    try:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            db_json = read_db_json()
            started = time.perf_counter()
            async with conn.transaction():
                await create_schema(conn)
            schema_s = time.perf_counter() - started
            started = time.perf_counter()
            await load(conn, db_json)
            load_s = time.perf_counter() - started
            ctx = SimpleNamespace(reproduce_last_variant_bug=not fix_bug)
            report = await check_tasks(conn, ctx=ctx)
        print(f"schema {schema_s:.2f} s, load {load_s:.2f} s")
        for task in report.tasks:
            if not task.ok:
                print(f"  task {task.task_id}: state {'matches' if task.state_matches else 'DIFFERS'}, "
                      f"raised {task.raised} (tau2 {task.expected_raised}), "
                      f"return values differ for {task.result_mismatches}")
        print(report.summary())
        return 0 if not report.mismatched else 1
    finally:
        drop_database(url)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fix-last-variant-bug", action="store_true",
                        help="replay with tau2's last-variant bug fixed (the tasks it touches then differ)")
    args = parser.parse_args()
    return asyncio.run(run(args.fix_last_variant_bug))


if __name__ == "__main__":
    sys.exit(main())
