"""Command line: ``python -m agentlab demo | chaos | tau2 | bench | db ...``.

Exit codes: 0 success, 1 the run itself failed, 2 the database could not be reached or started
(one line on stderr says what failed and how to fix it).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

DESCRIPTION = "Command line: python -m agentlab demo | chaos | bench | db ..."

# only the standard library here: a Ctrl-C while the rest imports is caught by main()


def _cmd_demo(args: argparse.Namespace) -> int:
    from agentlab.core.errors import DomainError
    from agentlab.demos.catalog import STORY_DOMAIN, WORKFLOW_DEMOS, story_names
    from agentlab.demos.demo import render, run_demo, to_json
    from agentlab.runtime.domains import resolve_domain

    try:
        domain = resolve_domain(args.domain)
        if domain is not resolve_domain(STORY_DOMAIN) and args.model is not None:
            print(f"agentlab demo: --model runs {STORY_DOMAIN}'s stories; {domain.name!r} plays its scripted model "
                  "(drop --model)", file=sys.stderr)
            return 2
        if domain is not resolve_domain(STORY_DOMAIN):
            return _domain_demo(args, domain)
    except DomainError as exc:  # a domain that cannot be found or lacks what a demo needs: one line
        print(f"agentlab demo: {exc}", file=sys.stderr)
        return 2
    args.scenario = args.scenario or "refund"
    if args.scenario not in story_names():
        print(f"agentlab demo: {STORY_DOMAIN} has no scenario {args.scenario!r} (choose one of: "
              f"{', '.join(story_names())})", file=sys.stderr)
        return 2
    if args.scenario in WORKFLOW_DEMOS and args.preset not in (None, "full"):
        print(f"agentlab: the {args.scenario} demo always runs under full (it shows what comes after one "
              f"transaction); drop --preset {args.preset}", file=sys.stderr)
        return 2
    args.preset = args.preset or "full"
    from agentlab.runtime.models import ModelUnavailable, model_from_args

    if args.scenario in WORKFLOW_DEMOS and args.model is not None:
        print(f"agentlab: the {args.scenario} demo plays scripted steps; drop --model", file=sys.stderr)
        return 2
    try:
        model = model_from_args(args)
    except ModelUnavailable as exc:
        print(f"agentlab: {exc}", file=sys.stderr)
        return 2
    rep = asyncio.run(run_demo(args.scenario, args.preset, seed=args.seed, keep=args.keep, model=model))
    print(to_json(rep) if args.json else render(rep))
    return 1 if rep["error"] else 0


def _domain_demo(args: argparse.Namespace, domain) -> int:
    """``demo --domain`` for a domain other than billing: one of its own scenarios; 1 when the run failed or
    an invariant broke. Raises DomainError (no such scenario, none at all) before any database is made."""
    from agentlab.core.errors import DomainError
    from agentlab.demos.demo import render, run_domain_demo, to_json

    if args.scenario is not None and args.scenario not in domain.scenarios:
        names = list(domain.scenarios)
        known = ", ".join(names[:6]) + (f", ... ({len(names)} in all)" if len(names) > 6 else "")
        raise DomainError(f"domain {domain.name!r} has no scenario {args.scenario!r} (its scenarios: "
                          f"{known or 'none'})")
    rep = asyncio.run(run_domain_demo(domain, args.scenario, args.preset or "full", seed=args.seed, keep=args.keep))
    print(to_json(rep) if args.json else render(rep))
    return 1 if rep["error"] or rep["violations"] else 0


def _cmd_chaos(args: argparse.Namespace) -> int:
    if args.agent:
        from agentlab.lab.yardstick_table import main as yardstick_main

        return yardstick_main(args)
    from agentlab.lab.experiments import main as chaos_main

    return chaos_main(args)


def _cmd_tau2(args: argparse.Namespace) -> int:
    from agentlab.lab.tau2 import main as tau2_main

    return tau2_main(args)


def _cmd_bench(args: argparse.Namespace) -> int:
    from agentlab.bench.suite import main as bench_main

    return bench_main(args)


def _cmd_db(args: argparse.Namespace) -> int:
    import os

    from agentlab.runtime import db

    if args.name is not None and args.action != "url":
        print(f"agentlab: db {args.action} takes no database name (only db url NAME does)", file=sys.stderr)
        return 2
    if args.action == "url":
        if args.name is None:
            print(db.server_url())
        elif args.name in db.list_databases():
            print(db.with_dbname(db.server_url(), args.name))
        else:
            print(f"agentlab: there is no agentlab database named {args.name!r} on this server; "
                  "`python -m agentlab db list` names them", file=sys.stderr)
            return 1
    elif args.action == "start":
        info = db.server()
        where = "embedded server" if info.embedded else "DATABASE_URL"
        how = "cold start (initdb)" if info.cold else "warm start or attach"
        print(f"{where} ready: {db.safe_dsn(info.url)} ({how}, {info.start_s:.2f} s)")
    elif args.action == "stop":
        if os.environ.get(db.ENV_VAR):
            print("DATABASE_URL is set: that server is not the kit's to stop")
        else:
            print("embedded server stopped" if db.stop_embedded() else "embedded server was not running")
    elif args.action == "clean":
        dropped = db.clean()
        print(f"dropped {len(dropped)} leftover database(s) nobody was using" + (": " + ", ".join(dropped) if dropped else ""))
    elif args.action == "list":
        names = db.list_databases()
        for name in names:
            print(name)
        if not names:
            print("no agentlab databases", file=sys.stderr)  # stdout stays a plain list of names
    elif args.action == "reset":
        if os.environ.get(db.ENV_VAR):
            print(f"dropped {db.reset()} agentlab database(s) on DATABASE_URL")
        else:
            print(db.reset_embedded())
    return 0


def _cmd_room(args: argparse.Namespace) -> int:
    from agentlab.runtime import room

    if args.action == "sql":
        print(room.render(args.attendees, prefix=args.prefix, budget=args.budget))
        return 0
    if args.action == "setup":
        lines = room.setup(args.attendees, prefix=args.prefix, budget=args.budget, templates_only=args.templates_only)
    else:
        lines = room.teardown(prefix=args.prefix)
    for line in lines or ["nothing to do"]:
        print(line)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser. Imports only light modules (names of presets, scenarios, faults),
    never LangGraph: ``--help`` answers at once."""
    from agentlab.core.safeguards import PRESETS
    from agentlab.demos.catalog import story_names

    parser = argparse.ArgumentParser(prog="python -m agentlab", description=DESCRIPTION)
    parser.add_argument("-v", "--verbose", action="store_true", help="log events to stderr")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="run a seed story end to end on a fresh database")
    demo.add_argument("--domain", default="billing", metavar="DOMAIN",
                      help="billing (default), retail, or package.module:NAME for your own; another domain plays "
                      "one of its own scenarios (default its first) and checks its invariants")
    demo.add_argument("--scenario", default=None, metavar="SCENARIO",
                      help=f"billing: {', '.join(story_names())} (default refund); "
                      "another domain: one of its scenarios")
    demo.add_argument("--preset", default=None, choices=list(PRESETS),
                      help="safeguards preset (default full; the saga and approval demos run under full only)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--json", action="store_true", help="print one JSON object")
    demo.add_argument("--keep", action="store_true",
                      help="keep the demo's database to inspect it (the demo prints the psql command; db clean drops it)")
    from agentlab.runtime.models import add_model_arguments

    add_model_arguments(demo)
    demo.set_defaults(func=_cmd_demo)

    from agentlab.lab.options import add_arguments, positive_int

    chaos = sub.add_parser("chaos", help="run the failure lab: faults x presets -> invariant violations")
    add_arguments(chaos)
    add_model_arguments(chaos, model=False)  # the chaos options hold --model (for --agent too)
    chaos.set_defaults(func=_cmd_chaos)

    tau2 = sub.add_parser("tau2", help="replay tau2-bench retail's 114 tasks through the node: hash matches, violations")
    tau2.add_argument("--presets", nargs="+", default=["full"], metavar="PRESET", choices=list(PRESETS))
    tau2.add_argument("--faults", nargs="+", default=["none"], metavar="FAULT",
                      help="none, crash_mid_node, backend_killed, crash_before_checkpoint, hallucinated_order_id, "
                      "check_violation, fk_violation, lock_timeout, statement_timeout, or all (default: none)")
    tau2.add_argument("--tasks", nargs="+", default=None, metavar="TASK", help="task ids (default: all 114)")
    tau2.add_argument("--fixed", action="store_true", help="fix tau2's last-variant bug instead of reproducing it")
    tau2.add_argument("--concurrency", type=int, default=4, help="workers, each a database of its own running one task at a time")
    tau2.add_argument("--json", action="store_true", help="print JSON: the table and, per task, hash and violations")
    tau2.set_defaults(func=_cmd_tau2)

    from agentlab.bench.suite import add_arguments as bench_arguments

    bench = sub.add_parser("bench", help="measure what the safety costs: node vs plain psycopg, episodes, experiment")
    bench_arguments(bench)
    bench.set_defaults(func=_cmd_bench)

    dbp = sub.add_parser("db", help="the database server: url [NAME], start, stop, list, clean, reset")
    dbp.add_argument("action", choices=["url", "start", "stop", "list", "clean", "reset"],
                     help="url: the server's maintenance database, or with NAME that database (for psql); "
                     "clean: drop leftover databases of interrupted runs; reset: start from scratch "
                     "(embedded: stop it and remove its data folder; DATABASE_URL: drop every agentlab database)")
    dbp.add_argument("name", nargs="?", default=None, metavar="NAME",
                     help="with url: an agentlab database, e.g. the one demo --keep kept (db list names them)")
    dbp.set_defaults(func=_cmd_db)

    roomp = sub.add_parser("room", help="a room on one server: setup, sql, teardown (instructor/ROOM.md)")
    roomp.add_argument("action", choices=["setup", "sql", "teardown"],
                       help="setup: the roles, limits and templates (as a superuser); sql: print setup's SQL to run "
                       "by hand; teardown: drop the attendees' databases and roles")
    roomp.add_argument("--attendees", type=positive_int, default=1, metavar="N", help="attendee1..attendeeN (default 1)")
    roomp.add_argument("--prefix", default="attendee", help="the roles' name before the number (default attendee)")
    roomp.add_argument("--budget", type=positive_int, default=10, metavar="B",
                       help="connections per attendee: the role's CONNECTION LIMIT (default 10)")
    roomp.add_argument("--templates-only", action="store_true", help="setup: only build the templates")
    roomp.set_defaults(func=_cmd_room)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit code. Ctrl-C at any point (the imports included) prints one line, 130."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("agentlab: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # --help and a refused option end here, before the heavy imports

    import psycopg
    from psycopg_pool import PoolTimeout

    from agentlab.core.errors import AgentlabError
    from agentlab.runtime import db
    from agentlab.runtime.conninfo import connect_reason

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    if not args.verbose:  # expected outcomes (a parked saga, a discarded broken connection) are not news
        for name in ("agentlab", "psycopg", "psycopg.pool"):
            logging.getLogger(name).setLevel(logging.ERROR)
    try:
        return args.func(args)
    except db.DatabaseUnavailable as exc:
        print(f"agentlab: {exc}", file=sys.stderr)
        return 2
    except (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout) as exc:
        if (limit := db.role_limit_message(exc)) is not None:
            print(f"agentlab: {limit}", file=sys.stderr)
            return 2
        reason = connect_reason(exc)
        print(f"agentlab: lost the database during the run ({type(exc).__name__}: {reason}); nothing after that "
              "point was applied. Check the server (`python -m agentlab db start`) and run again", file=sys.stderr)
        return 2
    except AgentlabError as exc:
        print(f"agentlab: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
