"""The notebooks' exercises: a statement, a stub the learner fills in, a check, a reference solution.

Each notebook's exercises live in a module of this package named for the notebook (``nb02.py`` holds
2.1 and 2.2), as ``EXERCISES = (Exercise(...), ...)``; an exercise is found from its id's prefix, so a
notebook's module is imported only when one of its exercises is asked for.

In a notebook::

    async def duplicate_refund(h, preset_name) -> dict:
        raise NotImplementedError

    await check("2.1", duplicate_refund)   # the learner's own function, on a fresh database per case
    await solution("2.1")                   # shows the reference solution, then checks it the same way

:func:`check` opens a fresh database for each :class:`Case` (``Harness.open(purpose="exercise")``),
runs the case's ``setup(h)``, calls ``fn(h, *args, **kwargs)`` and compares what it returns with the
case's expected values, key by key, printing one line per value (``passed: refund_rows = 1`` or
``FAILED: refund_rows = 2 (int), expected 1 (int); hint: ...``). Values compare by type and content
(:func:`agentlab.course.exercises.values.same`), never by the learner's object's own ``__eq__``: ``True``
is not a count of 1, and an object equal to everything equals nothing. A function that still raises
``NotImplementedError`` prints one line, ``not written yet: fill in `duplicate_refund` above``. A case
that takes longer than ``timeout_s`` (seconds; 60 unless the call says otherwise) is stopped and
prints one ``FAILED: ... took longer than 60 s ...`` line; the next case still runs.
``tests/test_solutions.py`` runs every reference solution through the same path, so the expected
values are written once, here.
"""

from __future__ import annotations

import ast
import asyncio
import importlib
import inspect
import pkgutil
import re
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentlab.course.exercises.values import described, same, shown
from agentlab.runtime.harness import Harness

__all__ = ["DEFAULT_TIMEOUT_S", "Case", "Exercise", "Verdict", "check", "exercises", "get_exercise", "reference",
           "solution", "solution_source"]

_ID = re.compile(r"^(\d{1,2})\.(\d+)$")
DEFAULT_TIMEOUT_S = 60.0  # seconds one case of a check may take (check's timeout_s)
BAR_DELAY_S = 2.0  # a check shows its bar over the cases once it has run this long (seconds)
_TIMEOUT_HINT = ("it waits for something that never comes (a lock another transaction holds, an await that never "
                 "returns, a loop with no end); its transaction was rolled back and its connection given back. "
                 "`timeout_s=None` lifts the limit")
_NOT_WRITTEN = "not written yet: fill in `{function}` above"
_MISSING = type("Missing", (), {"__repr__": lambda self: "missing"})()  # a key the function did not return


@dataclass(frozen=True)
class Verdict:
    """One value of a check: its ``name``, the ``value`` the function gave, whether it ``passed``, what
    was ``expected`` (shown with its ``repr`` and type when it failed, or ``expected_text`` as written when that is
    given, for a rule rather than a value) and a ``hint`` (None: the exercise's hint for ``name``)."""

    name: str
    value: Any
    passed: bool
    expected: Any = None
    hint: str | None = None
    expected_text: str | None = None


@dataclass(frozen=True)
class Case:
    """One call of the learner's function on a fresh database.

    ``fn(h, *args, **kwargs)`` is called after ``setup(h)`` (an optional coroutine function run first on
    that database, e.g. to play a batch whose tool call the function then explains). ``read`` turns what
    ``fn`` returned into the values compared (a DataFrame into a dict, say). ``expected`` is a dict,
    compared key by key (keys ``fn`` returns beyond these are not checked), or any other value, compared
    whole. ``domain`` is the database's domain (None: billing). ``label`` replaces the call shown above
    the case's lines.
    """

    args: tuple = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    expected: Any = None
    setup: Callable[[Any], Awaitable[Any]] | None = None
    read: Callable[[Any], Any] | None = None
    domain: str | None = None
    label: str | None = None

    def call_text(self, function: str) -> str:
        """``duplicate_refund(h, 'naive')``: the call this case makes, as shown above its lines."""
        if self.label:
            return self.label
        shown = ["h", *(repr(a) for a in self.args), *(f"{k}={v!r}" for k, v in self.kwargs.items())]
        return f"{function}({', '.join(shown)})"


@dataclass(frozen=True)
class Exercise:
    """An exercise of a notebook.

    ``id`` is ``"<notebook>.<n>"`` (``"2.1"``); ``function`` the name of the function the learner writes;
    ``solution`` the reference solution as ``"module:function"``
    (``"agentlab.course.solutions.ex02_constraints:duplicate_refund"``); ``cases`` the calls checked; ``hints``
    a hint per returned key (``"*"``: for any other key or a raised error). An exercise whose answer is not a function of a harness gives
    ``verify``: ``verify(fn)`` (plain or async) returns the :class:`Verdict` of each value, and ``cases``
    is then unused.
    """

    id: str
    title: str
    function: str
    solution: str
    cases: tuple[Case, ...] = ()
    hints: Mapping[str, str] = field(default_factory=dict)
    verify: Callable[[Callable], Iterable[Verdict] | Awaitable[Iterable[Verdict]]] | None = None

    def hint(self, key: str) -> str:
        """The hint for ``key``, else the exercise's general one (``"*"``), else a pointer to the statement."""
        return self.hints.get(key) or self.hints.get("*") or "read the statement above again"


def _module_of(exercise_id: str) -> str:
    match = _ID.match(exercise_id)
    if not match:
        raise ValueError(f"an exercise id is '<notebook>.<n>', such as '2.1', not {exercise_id!r}")
    return f"{__name__}.nb{int(match.group(1)):02d}"


def get_exercise(exercise_id: str) -> Exercise:
    """The exercise ``exercise_id`` (``"2.1"``), loaded from its notebook's module.

    Raises:
        ValueError: malformed id, or no such exercise (the message lists the ones that exist).
    """
    name = _module_of(exercise_id)
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
        known = ", ".join(e.id for e in exercises())
        raise ValueError(f"no exercise {exercise_id!r}: notebook {exercise_id.split('.')[0]} has none "
                         f"(exercises: {known})") from None
    for exercise in module.EXERCISES:
        if exercise.id == exercise_id:
            return exercise
    known = ", ".join(e.id for e in module.EXERCISES)
    raise ValueError(f"no exercise {exercise_id!r} (notebook {exercise_id.split('.')[0]} has {known})")


def exercises() -> list[Exercise]:
    """Every registered exercise, in notebook and exercise order."""
    found = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if re.fullmatch(r"nb\d\d", info.name):
            found.extend(importlib.import_module(f"{__name__}.{info.name}").EXERCISES)
    return sorted(found, key=lambda e: tuple(int(p) for p in e.id.split(".")))


def reference(exercise: Exercise | str) -> Callable:
    """The reference solution of ``exercise`` (an :class:`Exercise` or its id), imported."""
    ex = get_exercise(exercise) if isinstance(exercise, str) else exercise
    module, _, attr = ex.solution.partition(":")
    return getattr(importlib.import_module(module), attr)


def _compare(expected: Any, got: Any) -> list[Verdict]:
    """The verdicts on ``got``: whole, or key by key when ``expected`` is a dict (keys ``got`` has beyond
    those are not checked). Values compare by :func:`same`, never by ``got``'s own ``__eq__``; a dict
    of the learner's is read through ``dict``'s own methods (a subclass's overrides are not called)."""
    if not isinstance(expected, Mapping):
        return [Verdict("result", got, same(got, expected), expected)]
    if not issubclass(type(got), dict):
        return [Verdict("result", got, False, expected_text=f"a dict with the keys {', '.join(expected)}")]
    pairs = list(dict.items(got))
    out = []
    for key, want in expected.items():
        found = [value for k, value in pairs if same(k, key)]
        if not found:
            out.append(Verdict(key, _MISSING, False, want))
        else:
            out.append(Verdict(key, found[0], same(found[0], want), want))
    return out


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _print(verdict: Verdict, exercise: Exercise, indent: str) -> None:
    if verdict.passed:
        print(f"{indent}passed: {verdict.name} = {shown(verdict.value)}")
    else:
        hint = verdict.hint or exercise.hint(verdict.name)
        if verdict.value is _MISSING:
            hint = f"the dict returned has no key {verdict.name!r} (spelling counts); {hint}"
        given = "missing" if verdict.value is _MISSING else f"= {described(verdict.value)}"
        expected = verdict.expected_text if verdict.expected_text is not None else described(verdict.expected)
        print(f"{indent}FAILED: {verdict.name} {given}, expected {expected}; hint: {hint}")


class _LearnerError(Exception):
    """The learner's function (or what ``read`` made of its result) raised ``error``."""

    def __init__(self, error: Exception):
        super().__init__(" ".join(f"{type(error).__name__}: {error}".split("\n")))  # one FAILED line, always


class _CaseTimeout(Exception):
    """The learner's function ran past the check's ``timeout_s`` and was cancelled."""


async def _limited(awaitable: Awaitable[Any], timeout_s: float | None) -> Any:
    """Await ``awaitable`` for at most ``timeout_s`` seconds (None: no limit). Past it the awaitable is
    cancelled where it waits (psycopg cancels a running query; a ``transaction()`` block rolls back and a
    pool connection goes back to its pool as the cancellation unwinds) and :class:`_CaseTimeout` is
    raised. A ``TimeoutError`` the learner's own code raises is not the limit's: it stays theirs."""
    limit = asyncio.timeout(timeout_s)
    try:
        async with limit:
            return await awaitable
    except TimeoutError:
        if limit.expired():
            raise _CaseTimeout from None
        raise


async def _run_case(case: Case, fn: Callable, timeout_s: float | None = None) -> list[Verdict]:
    async with await Harness.open(purpose="exercise", domain=case.domain) as h:
        if case.setup is not None:
            await case.setup(h)
        try:
            got = await _limited(_maybe_await(fn(h, *case.args, **dict(case.kwargs))), timeout_s)
            if case.read is not None:
                got = case.read(got)
        except (NotImplementedError, _CaseTimeout):
            raise
        except Exception as exc:  # the learner's code failed: check says so and goes on with the next case
            raise _LearnerError(exc) from exc
    return _compare(case.expected, got)


def _timed_out(call: str, timeout_s: float) -> str:
    return f"FAILED: {call} took longer than {timeout_s:g} s and was stopped; hint: {_TIMEOUT_HINT}"


def _case_bar(exercise: Exercise, progress: bool | None):
    """A tqdm bar over ``exercise``'s cases (one step per case, on a fresh database each) that shows itself
    only once a case has taken :data:`BAR_DELAY_S` (a stub that raises at once, or a quick check, shows none);
    only when ``progress`` is True (a stored notebook output must not change with the machine's speed)."""
    from tqdm.auto import tqdm

    # mininterval 0: each of the few cases redraws the bar (once past the delay), the last one included, so
    # the bar never closes on a count it had not drawn (tqdm's default 0.1 s skipped the last case's step)
    return tqdm(total=len(exercise.cases), desc=f"check {exercise.id}", unit="case", leave=False,
                delay=BAR_DELAY_S, mininterval=0, disable=progress is not True or len(exercise.cases) < 2)


async def check(exercise_id: str, fn: Callable, *, timeout_s: float | None = DEFAULT_TIMEOUT_S,
                progress: bool | None = None, **given: Any) -> bool:
    """Check ``fn``, the learner's answer to exercise ``exercise_id``, and print a line per value.

    ``timeout_s``: seconds each case may take (default :data:`DEFAULT_TIMEOUT_S`, 60 s; for an exercise
    checked as a whole by its ``verify``, the whole check); None: no limit. A case past it is cancelled
    where it waits (a running query is cancelled in the server, an open transaction rolled back, its
    connections given back before its database is dropped) and prints ``FAILED: <call> took longer than
    60 s and was stopped; hint: ...``; the next case still runs. A function that blocks the event loop itself (``time.sleep``, a synchronous driver
    call) cannot be stopped this way: the limit applies once it gives control back.

    ``progress``: a bar over the cases (one fresh database each; 9.1's five cases run 70 episodes), shown
    once a case has taken :data:`BAR_DELAY_S` seconds, with ``progress=True`` (off by default: a check's
    output in a stored notebook stays the same however fast the machine).

    ``given``: what the notebook made that an exercise's ``verify`` needs besides ``fn`` (notebook 16's
    domain: ``await check("16.1", no_payout_without_its_intent, domain=PAYOUTS)``); passed to ``verify``.

    Each case runs on a fresh database (made and dropped here). Prints ``passed: key = value`` or
    ``FAILED: key = value, expected ...; hint: ...`` per value, under a line naming the call when the
    exercise has more than one case; ``not written yet: ...`` (once) when ``fn`` raises
    ``NotImplementedError``; ``FAILED: <call> raised <error>; hint: ...`` for any other error ``fn``
    raises (the next case still runs). Returns True when every value passed.

    Raises:
        ValueError: no exercise ``exercise_id``, or a ``timeout_s`` that is not a positive number or None.
        agentlab.runtime.db.DatabaseUnavailable: no server to make the databases on.
    """
    exercise = get_exercise(exercise_id)
    if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                                  or not timeout_s > 0):
        raise ValueError(f"timeout_s is a number of seconds > 0, or None for no limit, not {timeout_s!r}")
    try:
        if exercise.verify is not None:
            try:
                verdicts = list(await _limited(_maybe_await(exercise.verify(fn, **given)), timeout_s))
            except _CaseTimeout:
                print(_timed_out(f"check({exercise.id!r}, {exercise.function})", timeout_s))
                return False
            for verdict in verdicts:
                _print(verdict, exercise, "")
            return all(v.passed for v in verdicts)
        if given:
            raise TypeError(f"exercise {exercise.id} takes no arguments besides the function (got {', '.join(given)})")
        ok = True
        many = len(exercise.cases) > 1
        with _case_bar(exercise, progress) as bar:
            for case in exercise.cases:
                call = case.call_text(exercise.function)
                try:
                    verdicts = await _run_case(case, fn, timeout_s)
                except _LearnerError as exc:
                    print(f"FAILED: {call} raised {exc}; hint: {exercise.hint('*')}")
                    ok = False
                    bar.update(1)
                    continue
                except _CaseTimeout:
                    print(_timed_out(call, timeout_s))
                    ok = False
                    bar.update(1)
                    continue
                bar.update(1)  # not for a stub (NotImplementedError): it ends the check with no bar drawn
                if many:
                    print(f"{call}:")
                for verdict in verdicts:
                    _print(verdict, exercise, "  " if many else "")
                ok &= all(v.passed for v in verdicts)
        return ok
    except NotImplementedError:
        print(_NOT_WRITTEN.format(function=exercise.function))
        return False


def _bound_names(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def solution_source(exercise: Exercise | str) -> str:
    """The source of the reference solution of ``exercise``: the imports it uses, the module-level
    constants, helpers and classes it needs (transitively), and the function itself, in file order."""
    fn = reference(exercise)
    text = inspect.getsource(sys.modules[fn.__module__])
    tree = ast.parse(text)
    defs = {name: node for node in tree.body for name in _bound_names(node)}
    needed: list[ast.stmt] = []
    used: set[str] = set()
    todo = [fn.__name__]
    while todo:
        node = defs.get(todo.pop())
        if node is None or any(node is n for n in needed):
            continue
        needed.append(node)
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        used |= names
        todo.extend(names)
    lines = text.splitlines()
    imports = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module != "__future__" or isinstance(node, ast.Import):
            kept = [a for a in node.names if (a.asname or a.name).split(".")[0] in used]
            if kept:
                node = type(node)(**{**node.__dict__, "names": kept})
                imports.append(ast.unparse(node))
    out = "\n".join(imports)
    previous = None
    for node in tree.body:
        if any(node is n for n in needed):
            start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
            constants = isinstance(node, ast.Assign) and isinstance(previous, ast.Assign)
            out += ("\n" if constants else "\n\n\n") + "\n".join(lines[start - 1:node.end_lineno])
            previous = node
    return out


async def solution(exercise_id: str, *, timeout_s: float | None = DEFAULT_TIMEOUT_S, **given: Any) -> bool:
    """Print the reference solution of ``exercise_id`` (see :func:`solution_source`), then check it as
    :func:`check` checks a learner's function (with ``timeout_s``, seconds per case, and ``given``, as
    there); returns what the check returns.

    Raises:
        ValueError: no exercise ``exercise_id``, or a bad ``timeout_s`` (see :func:`check`).
    """
    exercise = get_exercise(exercise_id)
    print(f"# {exercise.solution.replace(':', '.')}, exercise {exercise.id} · {exercise.title}")
    print(solution_source(exercise))
    print()
    shown = "".join(f", {k}=..." for k in given)
    print(f"# await check({exercise.id!r}, {exercise.function}{shown})")
    return await check(exercise_id, reference(exercise), timeout_s=timeout_s, **given)
