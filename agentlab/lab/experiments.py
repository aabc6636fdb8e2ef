"""Experiments: episodes x presets x faults on one database, and the ``chaos`` command that runs them.

:func:`run_experiment` runs ``episodes`` seeded episodes for every (fault, preset) pair, ``concurrency``
at a time, on one fresh database with one harness, one provider and one agent process (each episode
with its own thread id and its own customers: :mod:`agentlab.lab.runner`). Episode ``i`` of a fault plays the
same scenario with the same hallucinations and the same model seed under every preset, so the presets
are compared on identical episodes. The result holds one row per episode and the summary
(:class:`agentlab.lab.experiment_results.ExperimentResult`, whose module holds the rows, the fault x preset
table and the command's text; those names stay importable from here).

Same seed, same table: the violations per episode depend on the seed only (wall times do not).

The run's speed comes from sharing: one compiled graph per preset, pools sized for the concurrency,
checkpoints written once per run except where a fault resumes from one, and the experiment's own
database committing with ``synchronous_commit = off`` (the faults here kill processes, never the
server, so a commit the server has acknowledged is never lost in this lab); and from cores: with
``workers > 1`` the episodes run in several processes (:mod:`agentlab.lab.parallel`), since one Python
process runs the lab on one core.

The faults that restart the server (``server_restart``, ``server_restart_immediate``: ``Fault.restarts_server``)
are the exception to all three: an experiment naming one keeps synchronous commits, and runs their episodes
one at a time in this process after every other episode, since a restart cuts every session on the server.

Sources: tqdm ("tqdm.auto"); pandas ("DataFrame").
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence

from agentlab.core import budget
from agentlab.core.errors import DomainError, is_infrastructure
from agentlab.core.safeguards import PRESETS, Safeguards, preset
from agentlab.lab.experiment_results import (  # noqa: F401 (their home moved to agentlab.lab.experiment_results)
    LADDER,
    ROW_COLUMNS,
    RUNG_GUARDS,
    ExperimentResult,
    kinds_of,
    lab_error_row,
    render,
    row,
    safeguard_effects,
    summarize,
)
from agentlab.lab.faults import FAULTS, fault_scenarios, faults_for, get_fault, injected_by_script  # noqa: F401
from agentlab.lab.invariants import KINDS, count_by_kind  # noqa: F401 (importable from here as before)
from agentlab.lab.options import DEFAULT_CONCURRENCY, add_arguments, png_path, positive_int  # noqa: F401 (re-exported)
from agentlab.lab.runner import FaultRun, Lab  # noqa: F401 (FaultRun importable from here as before)
from agentlab.runtime import db
from agentlab.runtime.domains import domain_reference, resolve_domain
from agentlab.runtime.harness import Harness

SET_ASYNC_COMMIT = "ALTER DATABASE {} SET synchronous_commit = off"


def episode_seed(seed: int, episode: int) -> int:
    """The seed of episode ``episode`` of an experiment seeded ``seed`` (the same for every fault and preset)."""
    return random.Random(f"agentlab:{seed}:{episode}").randrange(2**31)


def _progress(total: int, enabled: bool | None):
    from tqdm.auto import tqdm

    disable = (not sys.stderr.isatty()) if enabled is None else not enabled
    return tqdm(total=total, disable=disable, unit="episode", desc="chaos", leave=False)


def _repeated(names: Iterable[str]) -> str | None:
    """The first name that comes twice in ``names``, or None."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            return name
        seen.add(name)
    return None


def _checked_matrix(episodes: int, presets, faults, *, concurrency: int, workers: int, domain, model):
    """The experiment's presets (by name), domain, fault names and objects, and worker count, checked before
    any episode runs. Raises ValueError as :func:`run_experiment` says."""
    if episodes < 1 or concurrency < 1 or workers < 1:
        raise ValueError(f"episodes, concurrency and workers must be at least 1 (got {episodes}, {concurrency}, "
                         f"{workers})")
    chosen = [preset(p) if isinstance(p, str) else p for p in (presets or PRESETS)]
    twice = _repeated(sg.name for sg in chosen)
    if twice:
        raise ValueError(f"preset {twice!r} is given more than once; presets must have distinct names (give a "
                         "custom Safeguards value its own name=)")
    by_name = {sg.name: sg for sg in chosen}
    presets = tuple(by_name)
    domain = resolve_domain(domain)
    faults = tuple(faults or faults_for(domain))
    twice = _repeated(faults)
    if twice:
        raise ValueError(f"fault {twice!r} is given more than once; name each fault once")
    fault_objs = [get_fault(f, domain) for f in faults]
    for f in fault_objs:
        fault_scenarios(f, domain)  # a fault that does not fit the domain: ValueError before any episode
    scripted = [f.name for f in fault_objs if injected_by_script(f)]
    if model is not None and scripted:
        raise ValueError(f"fault(s) {', '.join(scripted)} are injected through the scripted model's calls; a real "
                         "model decides its own, so leave them out")
    if model is not None or domain_reference(domain) is None:  # a worker process must find the domain again
        workers = 1
    if budget.pool_cap() is not None:  # AGENTLAB_MAX_CONNECTIONS: one process, its pools bounded
        workers = 1
    return by_name, domain, faults, fault_objs, workers


async def run_experiment(episodes: int = 10, presets: Iterable[str | Safeguards] | None = None,
                         faults: Iterable[str] | None = None, *, seed: int = 0,
                         concurrency: int = DEFAULT_CONCURRENCY, progress: bool | None = None,
                         url: str | None = None, durability: str | None = None,
                         fast_commit: bool = True, workers: int = 1, domain=None, model=None) -> ExperimentResult:
    """Run ``episodes`` episodes for every (fault, preset) pair and check each.

    Args:
        episodes: episodes per (fault, preset) cell.
        presets: preset names or :class:`agentlab.core.safeguards.Safeguards` values with distinct names (default:
            the whole ladder, in order; :meth:`ExperimentResult.safeguard_effects` compares neighbours).
        faults: fault names (default: every fault of the catalog).
        seed: seeds the episodes (scenario choice, hallucinations, model call ids).
        concurrency: episodes in flight at once (in all worker processes together).
        progress: show a tqdm bar (default: when stderr is a terminal).
        url: run on this database (default: a fresh one, dropped afterwards).
        durability: force one LangGraph durability for every episode (default: per fault, see :mod:`agentlab.lab.runner`).
            ``"exit"`` writes a checkpoint only when a run ends: a fault that resumes from a checkpoint
            finds none after a crash (see :meth:`agentlab.runtime.harness.Harness.run_episode`).
        fast_commit: ``synchronous_commit = off`` for the fresh experiment database (ignored with ``url``, and when
            a fault restarts the server).
        workers: processes running the episodes (:mod:`agentlab.lab.parallel`); 1 runs them in this process.
            The rows are the same for any number. A domain other than billing runs in this process.
        domain: the domain to run (a :class:`agentlab.core.domain.Domain`, ``"billing"`` (default) or
            ``"package.module:NAME"``); the faults default to those that fit it
            (:func:`agentlab.lab.faults.faults_for`), and its own invariant kinds get a column each.
        model: a real chat model (:func:`agentlab.runtime.models.load_model`) to play every episode instead of
            the scripted one; the episodes then run in this process, and a fault injected through the
            script (:func:`agentlab.lab.faults.injected_by_script`) is refused.

    Raises:
        ValueError: an unknown preset or fault name, or one given twice; ``episodes``, ``concurrency`` or ``workers`` below 1;
            a fault that restarts the server with ``DATABASE_URL`` set or a ``url`` on another server.
        agentlab.runtime.db.DatabaseUnavailable: no server, or it stopped answering during the run (the
            experiment stops within about two seconds; its database is left to ``db clean``).
    """
    by_name, domain, faults, fault_objs, workers = _checked_matrix(episodes, presets, faults, concurrency=concurrency,
                                                                   workers=workers, domain=domain, model=model)
    concurrency = budget.capped(concurrency)  # AGENTLAB_MAX_CONNECTIONS: the episodes in flight fit the pools
    presets = tuple(by_name)
    restarting = {f.name for f in fault_objs if f.restarts_server}
    if restarting:
        await asyncio.to_thread(_check_restartable, url, restarting)
    jobs = [(i, f, p) for i in range(episodes) for f in faults for p in presets if f not in restarting]
    alone = [(i, f, p) for i in range(episodes) for f in faults for p in presets if f in restarting]
    workers = max(1, min(workers, len(jobs)))
    created = url is None
    if created:
        url = await asyncio.to_thread(db.create_database, "chaos", domain)
        if fast_commit and not restarting:  # an immediate restart loses commits acknowledged, not yet flushed
            await asyncio.to_thread(commit_without_flush_wait, url)
    try:
        h = await Harness.open(url, pool_max=max(8, concurrency // 4 + 8), domain=domain)  # fault controllers, checker
    except BaseException:
        if created:
            await asyncio.to_thread(db.drop_database, url)
        raise
    try:
        await preflight(h, domain)
    except BaseException as exc:
        await _close_quietly(h, url if created else None, exc)
        raise
    bar = _progress(len(jobs) + len(alone), progress)
    try:
        if not jobs:
            results, wall_s, cpu_s = [], 0.0, 0.0
        elif workers > 1:
            from agentlab.lab.parallel import run_sharded

            async def install() -> None:
                async with Lab(h) as lab:
                    for f in fault_objs:
                        await lab.install(f)

            await h.watched(install())
            results, wall_s, cpu_s = await h.watched(run_sharded(  # a server gone is told as one process tells it
                url, jobs, by_name, run_jobs=run_jobs, workers=workers, seed=seed, concurrency=concurrency,
                durability=durability, on_done=lambda n: bar.update(n - bar.n), domain=domain_reference(domain)))
        else:
            results, wall_s, cpu_s = await run_jobs(h, jobs, by_name, seed=seed, concurrency=concurrency,
                                                    durability=durability, on_done=lambda: bar.update(1), model=model)
        if alone:  # a server restart cuts every session: one such episode at a time, nothing else in flight
            more, more_wall_s, more_cpu_s = await run_jobs(h, alone, by_name, seed=seed, concurrency=1,
                                                           durability=durability, on_done=lambda: bar.update(1),
                                                           model=model)
            results, wall_s, cpu_s = results + more, wall_s + more_wall_s, cpu_s + more_cpu_s
    except BaseException as exc:
        bar.close()
        await _close_quietly(h, url if created else None, exc)
        raise
    bar.close()
    await h.close()
    if created:
        await asyncio.to_thread(db.drop_database, url)
    import pandas as pd

    extra = list(dict.fromkeys(k for r in results for k in r if k not in ROW_COLUMNS))  # a domain's own kinds
    rows = pd.DataFrame(results, columns=[*ROW_COLUMNS[:-1], *extra, ROW_COLUMNS[-1]])
    if extra:
        rows[extra] = rows[extra].fillna(0).astype(int)
    order = {f: n for n, f in enumerate(faults)}, {p: n for n, p in enumerate(presets)}
    rows = rows.sort_values(["fault", "preset", "episode"], key=lambda s: s.map(order[0]) if s.name == "fault"
                            else s.map(order[1]) if s.name == "preset" else s).reset_index(drop=True)
    return ExperimentResult(rows, wall_s, seed, episodes, presets, faults, cpu_s, workers)


async def preflight(h: Harness, domain) -> None:
    """Run each of ``domain``'s invariants once on the fresh database (no episode rows yet), so that an
    invariant that raises is found before any episode. Raises DomainError naming it."""
    from agentlab.core.domain import InvariantContext

    if not domain.invariants:
        return
    scenario = next(iter(domain.scenarios.values()), None)
    async with h.pool.connection() as conn:
        for inv in domain.invariants:
            try:
                await inv.check(InvariantContext(conn, "preflight", [], "public", scenario, []))
            except Exception as exc:
                raise DomainError(f"domain {domain.name!r}: invariant {inv.kind!r} raised "
                                  f"{type(exc).__name__}: {exc} (on a fresh database, before any episode)") from exc


async def run_jobs(h: Harness, jobs: Sequence[tuple[int, str, str]], by_name: dict[str, Safeguards], *, seed: int,
                   concurrency: int, durability: str | None, on_done: Callable[[], None] | None = None,
                   should_stop: Callable[[], bool] | None = None, model=None) -> tuple[list[dict], float, float]:
    """Run ``jobs`` (``(episode, fault, preset name)``) on ``h``'s database in this process, ``concurrency``
    at a time; return one row per job (in completion order), the wall seconds and this process's CPU seconds.

    An episode the lab itself fails on becomes a row with its error; the experiment goes on. No new
    episode starts once ``should_stop()`` is true (the rows so far are returned).

    Raises:
        agentlab.runtime.db.DatabaseUnavailable: the server stopped answering; the episodes in flight are
            cancelled at once rather than each waiting for a connection.
    """
    lab = Lab(h, pool_max=concurrency + 4, checkpointer_max=min(8, max(2, concurrency // 4)))
    results: list[dict] = []

    async def worker(it) -> None:
        for i, f, p in it:
            if should_stop is not None and should_stop():
                return
            try:
                run = await lab.run(f, by_name[p], seed=episode_seed(seed, i), durability=durability,
                                    model=None if model is None else lambda script, seed: model)
                results.append(row(run, i))
            except DomainError:
                raise  # a wrong domain is the user's to fix, not a row of the table
            except Exception as exc:  # the lab itself failed: keep the experiment, show the row
                if is_infrastructure(exc):
                    await h.ensure_reachable(exc)  # no server: DatabaseUnavailable ends the experiment
                results.append(lab_error_row(f, p, i, episode_seed(seed, i), exc))
            if on_done is not None:
                on_done()

    async def body() -> tuple[list[dict], float, float]:
        await lab.start()
        for f in dict.fromkeys(f for _, f, _ in jobs):
            await lab.install(get_fault(f, h.domain))
        t0, cpu0 = time.perf_counter(), time.process_time()
        it = iter(jobs)
        tasks = [asyncio.create_task(worker(it)) for _ in range(min(concurrency, len(jobs)))]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            await _cancel(tasks, release=lab.close)
            raise
        return results, time.perf_counter() - t0, time.process_time() - cpu0

    try:
        return await h.watched(body())  # a server that goes away ends the run in seconds
    finally:
        await lab.close()


async def _cancel(tasks: list[asyncio.Task], grace_s: float = 2.0,
                  release: Callable[[], Awaitable[None]] | None = None) -> None:
    """Cancel ``tasks`` and wait until every one has ended, retrieving what each raised.

    Their clean-up gets ``grace_s`` seconds; what still runs is cancelled again and gets ``grace_s`` more; what
    still runs then waits on something cancellation cannot reach (a shielded checkpoint write waiting for a
    pooled connection to a server that is gone): ``release()`` (closing the pools, which wakes every borrower
    with ``PoolClosed``) ends it, and it gets ``10 * grace_s`` more before it is left behind.

    The clean-up finishes even when the caller is cancelled meanwhile (the server watchdog cancels the
    experiment while it is cancelling its episodes after one of them saw the server go first): that
    cancellation is raised once the tasks have ended, so no episode outlives its pools and no episode's error is
    logged as unretrieved at the process's exit.
    """
    for t in tasks:
        t.cancel()
    cancelled = False

    async def wait(timeout_s: float) -> set[asyncio.Task]:
        nonlocal cancelled
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        pending = {t for t in tasks if not t.done()}
        while pending and loop.time() < deadline:
            try:
                _, pending = await asyncio.wait(pending, timeout=deadline - loop.time())
            except asyncio.CancelledError:
                cancelled = True  # the caller is going: finish this clean-up first, then go too
                pending = {t for t in pending if not t.done()}
        return pending

    pending = await wait(grace_s)
    for t in pending:
        t.cancel()
    pending = await wait(grace_s) if pending else pending
    if pending and release is not None:
        try:
            await asyncio.shield(release())
        except asyncio.CancelledError:
            cancelled = True
        except Exception:  # noqa: BLE001 (a pool that fails to close still woke its borrowers)
            pass
        await wait(10 * grace_s)
    for t in tasks:
        if t.done() and not t.cancelled():
            t.exception()  # retrieved: a cancelled episode's error is not logged at the process's exit
    if cancelled:
        raise asyncio.CancelledError


async def _close_quietly(h: Harness, url: str | None, exc: BaseException) -> None:
    """Close ``h`` and drop the database at ``url`` after a failed run, without hiding its error: with the
    server gone, the database is left to ``python -m agentlab db clean``."""
    if isinstance(exc, db.DatabaseUnavailable):
        h.events.abandon()
    try:
        await h.close()
        if url is not None:
            await asyncio.to_thread(db.drop_database, url)
    except Exception:
        pass


def _check_restartable(url: str | None, faults: set[str]) -> None:
    """Raise ValueError unless the experiment runs on the kit's embedded server, the one a fault of ``faults``
    (which restart the server) can restart: not with ``DATABASE_URL`` set, nor on a ``url`` of another server."""
    names = ", ".join(sorted(faults))
    if os.environ.get(db.ENV_VAR, "").strip():
        raise ValueError(f"fault(s) {names} restart the database server; the kit restarts only its embedded one, so "
                         "unset DATABASE_URL (and use a data folder of your own: AGENTLAB_HOME, since every process "
                         "on the server is cut)")
    if url is not None and not db.is_embedded(url):
        raise ValueError(f"fault(s) {names} restart the database server; {db.safe_dsn(url)} is not on the kit's "
                         "embedded server, which is the only one it restarts")


def commit_without_flush_wait(url: str) -> None:
    """``synchronous_commit = off`` for every later session of the database at ``url`` (before any opens)."""
    from psycopg import sql

    with db.admin_connection() as conn:
        conn.execute(sql.SQL(SET_ASYNC_COMMIT).format(sql.Identifier(db.dbname_of(url))))


def main(args) -> int:
    """Run the ``chaos`` subcommand and print its table (or JSON); 0 on success."""
    import json
    import logging

    for name in ("psycopg", "psycopg.pool"):  # killed backends and lost connections are the point here
        logging.getLogger(name).setLevel(logging.ERROR)
    from agentlab.core.errors import DomainError
    from agentlab.lab.options import YARDSTICK_ONLY_FAULTS
    from agentlab.lab.parallel import default_workers, run_loop
    from agentlab.runtime.models import ModelUnavailable, model_from_args

    try:
        domain = resolve_domain(args.domain)
        faults = args.faults or faults_for(domain)
        if agents_only := [f for f in faults if f in YARDSTICK_ONLY_FAULTS]:
            raise ValueError(f"fault(s) {', '.join(agents_only)} run agents side by side: add --agent, e.g. "
                             "--agent toolnode create_agent kit")
        for f in faults:
            fault_scenarios(get_fault(f, domain), domain)
        model = model_from_args(args)
        if model is not None and not args.faults:  # by default, the faults a real model can be given
            faults = [f for f in faults if not injected_by_script(get_fault(f, domain))]
        elif model is not None and (scripted := [f for f in faults if injected_by_script(get_fault(f, domain))]):
            raise ValueError(f"with --model, fault(s) {', '.join(scripted)} cannot be injected (they go through "
                             "the scripted model's calls); leave them out")
    except (DomainError, ValueError, ModelUnavailable) as exc:
        print(f"agentlab chaos: {exc}", file=sys.stderr)
        return 2
    cells = len(args.presets or PRESETS) * len(faults)
    workers = args.workers if args.workers is not None else default_workers(args.episodes * cells)
    result = run_loop(run_experiment(
        args.episodes, args.presets, faults, seed=args.seed, concurrency=args.concurrency,
        progress=False if (args.no_progress or args.json) else None, workers=max(1, workers), domain=domain,
        model=model, durability=getattr(args, "durability", None),
    ))
    print(json.dumps(result.to_json(), default=str) if args.json else render(result), flush=True)
    if args.plot:  # after the table: a plot that cannot be written loses no result
        import matplotlib

        matplotlib.use("Agg")
        from agentlab.lab.charts import experiment_heatmap, save

        try:
            save(experiment_heatmap(result), args.plot)
        except OSError as exc:
            print(f"agentlab: could not write the plot {args.plot} ({exc.strerror or exc}); the table above "
                  "is the whole result", file=sys.stderr)
            return 1
    return 0
