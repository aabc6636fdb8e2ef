"""Running an experiment's episodes in several processes, and the event loop the command line uses.

One Python process runs the lab's episodes on one core: LangGraph's engine, psycopg and the lab
itself are Python code under one GIL, and PostgreSQL needs the other cores. :func:`run_sharded`
splits the episode list into interleaved shards (every worker gets the same mix of faults and
presets) and runs each in a worker process of its own, started with ``spawn`` (no state of the
parent's event loop or pools is inherited), with its own harness, pools, checkpointer and agent
processes on the same database. An episode's result depends on its seed alone, so the rows are the
same whichever worker ran them; the caller sorts them.

The workers open their pools first and start their episodes together, when the parent says so:
the experiment's wall time is measured from that start to the last episode, as in one process.
A worker's event loop runs ``asyncio.to_thread`` calls inline (:class:`InlineExecutor`): the
checkpointer serializes each checkpoint in a thread, and the handoff costs more than the work.

:func:`run_loop` runs a coroutine on uvloop's event loop when uvloop is installed (about half the
event loop's cost per database round trip), else on asyncio's.

Sources: Python docs "concurrent.futures.ProcessPoolExecutor", "multiprocessing: Contexts and start
methods"; uvloop "Using uvloop".
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

READY_TIMEOUT_S = 120.0  # a worker that cannot open its pools in this time fails the experiment
_LOGGERS = ("psycopg", "psycopg.pool", "agentlab", "agentlab.core.events")

# set in each worker process by _init_worker
_done = None
_ready = None
_go = None
_stop = None
_parent_pid = None


def _should_stop() -> bool:
    """In a worker: the parent asked to stop (a failure elsewhere, Ctrl-C), or died (killed)."""
    return _stop.is_set() or os.getppid() != _parent_pid


def event_loop_name() -> str:
    """``"uvloop"`` when :func:`run_loop` uses it, else ``"asyncio"``."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def run_loop(coro: Coroutine) -> Any:
    """``asyncio.run(coro)``, on uvloop's event loop when uvloop is installed."""
    try:
        import uvloop
    except ImportError:
        uvloop = None
    if uvloop is None:  # outside the except block: the run's own errors are not chained to this ImportError
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def default_workers(episodes: int) -> int:
    """Worker processes for an experiment of ``episodes`` episodes: one per core, at most one per 250
    episodes (starting a worker costs about a second of imports), and one on a single core."""
    return max(1, min(os.cpu_count() or 1, episodes // 250))


class InlineExecutor(concurrent.futures.ThreadPoolExecutor):
    """An executor that runs each call at once in the calling thread (the event loop's default executor
    in a worker process: see :func:`_shard`).

    The Postgres checkpointer serializes every checkpoint in ``asyncio.to_thread``: a few microseconds
    of work, handed to a thread and back, which costs the lab far more (about a sixth of a worker's CPU
    when checkpoints are written at every super-step). A worker process runs nothing else that blocks."""

    def submit(self, fn, /, *args, **kwargs) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # handed to the awaiting coroutine, as a thread would
            future.set_exception(exc)
        return future


def _init_worker(done, ready, go, stop, levels: dict[str, int], root_level: int, parent_pid: int) -> None:
    global _done, _ready, _go, _stop, _parent_pid
    _done, _ready, _go, _stop, _parent_pid = done, ready, go, stop, parent_pid
    logging.basicConfig(level=root_level, format="%(levelname)s %(name)s: %(message)s")
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def _count(counter) -> None:
    with counter.get_lock():
        counter.value += 1


def _run_shard(url: str, jobs: list[tuple], by_name: dict, options: dict) -> tuple[list[dict], float]:
    """A worker's whole life: open, say ready, wait for the start, run its jobs; its rows and CPU seconds."""
    return run_loop(_shard(url, jobs, by_name, options))


async def _shard(url: str, jobs: list[tuple], by_name: dict, options: dict) -> tuple[list[dict], float]:
    from agentlab.runtime.harness import Harness

    concurrency = options["concurrency"]
    h = await Harness.open(url, pool_max=max(8, concurrency // 4 + 8), domain=options.get("domain"))
    try:
        _count(_ready)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not _go.is_set():
            if time.monotonic() > deadline:
                raise TimeoutError("the experiment's other workers did not get ready in time")
            await asyncio.sleep(0.01)
        asyncio.get_running_loop().set_default_executor(InlineExecutor(max_workers=1))
        rows, _, cpu_s = await options["run_jobs"](h, jobs, by_name, seed=options["seed"], concurrency=concurrency,
                                        durability=options["durability"], on_done=lambda: _count(_done),
                                        should_stop=_should_stop)
    finally:
        await h.close()
    return rows, cpu_s


@contextlib.contextmanager
def _sigint_ignored():
    """Ignore SIGINT while worker processes are started: a signal ignored at ``exec`` stays ignored,
    so a Ctrl-C reaches only this process, which stops the workers after their episodes in flight
    (a worker interrupted mid-import or mid-episode would print a traceback and leave work behind)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


async def run_sharded(url: str, jobs: Sequence[tuple], by_name: dict, *, run_jobs: Callable, workers: int,
                      seed: int, concurrency: int, durability: str | None,
                      on_done: Callable[[int], None] | None = None, domain: str | None = None,
                      ) -> tuple[list[dict], float, float]:
    """Run ``jobs`` (``(episode, fault, preset)``) in ``workers`` processes on the database at ``url``, for
    ``domain`` (a reference each worker resolves: :func:`agentlab.runtime.domains.domain_reference`; None: billing),
    ``concurrency`` episodes in flight in all (shared out evenly). Returns the rows, the wall seconds from
    the common start to the last episode, and the CPU seconds of all workers' episodes. ``on_done(n)``
    is called with the number of episodes finished so far, about four times a second. ``run_jobs`` is
    the module-level coroutine function each worker runs its share with
    (:func:`agentlab.lab.experiments.run_jobs`; passed by reference to the worker processes).

    The faults' database objects must be installed before (:meth:`agentlab.lab.runner.Lab.install`).

    When a worker fails (for example :class:`agentlab.runtime.db.DatabaseUnavailable`) or this coroutine is
    cancelled (Ctrl-C), the other workers start no new episode and end after the ones in flight.

    Raises:
        Exception: the first error a worker raised.
    """
    ctx = multiprocessing.get_context("spawn")
    done, ready, go, stop = ctx.Value("i", 0), ctx.Value("i", 0), ctx.Event(), ctx.Event()
    levels = {name: logging.getLogger(name).level for name in _LOGGERS}
    shards = [list(jobs[k::workers]) for k in range(workers)]
    shards = [s for s in shards if s]
    per_worker = [max(1, concurrency // len(shards) + (k < concurrency % len(shards))) for k in range(len(shards))]
    loop = asyncio.get_running_loop()
    with concurrent.futures.ProcessPoolExecutor(len(shards), mp_context=ctx, initializer=_init_worker,
                                                initargs=(done, ready, go, stop, levels, logging.getLogger().level,
                                                          os.getpid())) as pool:
        with _sigint_ignored():  # the workers are born ignoring Ctrl-C: this process stops them (``stop``)
            futures = [loop.run_in_executor(pool, _run_shard, url, shard, by_name,
                                            {"seed": seed, "concurrency": c, "durability": durability,
                                             "run_jobs": run_jobs, "domain": domain})
                       for shard, c in zip(shards, per_worker)]
        pending = set(futures)
        try:
            while ready.value < len(shards) and not any(f.done() for f in futures):
                await asyncio.sleep(0.05)
            go.set()
            t0 = time.perf_counter()
            while pending:
                finished, pending = await asyncio.wait(pending, timeout=0.25)
                if on_done is not None:
                    on_done(done.value)
                failed = [f for f in finished if f.exception() is not None]
                if failed:
                    raise failed[0].exception()
        except BaseException:
            stop.set()  # the others start no new episode; the pool's exit waits for their episodes in flight
            go.set()  # and none waits for a start that never comes
            await asyncio.gather(*pending, return_exceptions=True)
            raise
        wall_s = time.perf_counter() - t0
        results = [f.result() for f in futures]
    rows = [r for shard_rows, _ in results for r in shard_rows]
    return rows, wall_s, sum(cpu for _, cpu in results)
