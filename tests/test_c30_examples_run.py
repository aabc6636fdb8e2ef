"""Case C30: the code examples in the README and in public docstrings run as written.

Input: every ```python block of README.md and every literal block (``::``) of a public docstring in the
package (modules, public classes, their public methods, public functions).
Right result: each runs and passes, doctest-style: a docstring's example runs with the package's public
names (``from agentlab import ...``, as a notebook has them) and its module's globals (as doctest's do),
a README block with the public names; both with ``h``, a harness on a fresh database, as a notebook's
first cell leaves it. ``await`` works at the top level, as in a notebook.
Blocks that are not Python (an exception tree, a state diagram) are named below, so a broken example
cannot pass for one.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest

import agentlab
from agentlab.runtime.harness import Harness

ROOT = Path(__file__).resolve().parent.parent
# literal blocks that are diagrams, not code: (where, first line)
OPTIONAL_ENGINES = {"dbos", "temporalio", "pydantic_ai"}  # requirements-engines.txt

NOT_CODE = {
    ("agentlab.core.errors", "AgentlabError                   base of every error the kit raises on purpose"),
    ("agentlab.core.batch.savepoints", "BEGIN; settings, the thread's lock, the ledger look-up      (opening.open_batch)"),
    ("agentlab.core.batch.budgets", "SAVEPOINT tool_call"),
    ("agentlab.core.batch.timeouts", "SAVEPOINT tool_call"),
    ("agentlab.core.tracing", "invoke_agent agentlab          a run (``ainvoke``, ``astream``, a resume): "
                              "gen_ai.conversation.id (the thread)"),
    ("agentlab.lab.loop", "open the agent's process          client.open()"),
    ("agentlab.durable.jobs", "pending ──claim──> running ──complete──> succeeded          (result stored, same transaction"),
}


def literal_blocks(doc: str) -> list[str]:
    """The reStructuredText literal blocks of ``doc``: the indented lines after a line ending in ``::``."""
    lines, blocks, i = doc.splitlines(), [], 0
    while i < len(lines):
        if not lines[i].rstrip().endswith("::"):
            i += 1
            continue
        base = len(lines[i]) - len(lines[i].lstrip())
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        body = []
        while j < len(lines) and (not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > base):
            body.append(lines[j])
            j += 1
        if body:
            blocks.append(textwrap.dedent("\n".join(body)).strip())
        i = max(j, i + 1)
    return blocks


def _public(module):
    yield module
    for name, obj in vars(module).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(obj):
            yield obj
        elif inspect.isclass(obj):
            yield obj
            for attr, member in vars(obj).items():
                member = getattr(member, "__func__", member)
                if not attr.startswith("_") and inspect.isfunction(member):
                    yield member


def docstring_examples() -> list[tuple[str, str, str]]:
    """``(module, where, block)`` for every literal block of a public docstring in the package."""
    found = []
    for info in pkgutil.walk_packages(agentlab.__path__, "agentlab."):
        try:
            module = importlib.import_module(info.name)
        except ModuleNotFoundError as exc:  # an optional engine's app (requirements-engines.txt) not installed here
            if exc.name in OPTIONAL_ENGINES:
                continue
            raise
        for obj in _public(module):
            for block in literal_blocks(inspect.getdoc(obj) or ""):
                found.append((info.name, getattr(obj, "__qualname__", info.name), block))
    return found


DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def readme_examples(path: Path = ROOT / "README.md") -> list[str]:
    """The ```python blocks of ``path`` (the README or a page of ``docs/``), in order."""
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), re.MULTILINE | re.DOTALL)


def is_python(block: str) -> bool:
    try:
        compile(block, "<example>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT | ast.PyCF_ONLY_AST)
    except SyntaxError:
        return False
    return True


async def run_example(block: str, namespace: dict, where: str) -> None:
    code = compile(block, f"<example in {where}>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = eval(code, namespace)  # a coroutine when the block awaits
    if inspect.iscoroutine(result):
        await result


EXAMPLES = docstring_examples()
PUBLIC = {name: getattr(agentlab, name) for name in agentlab.__all__}
MODULES = sorted({m for m, _, b in EXAMPLES if is_python(b)})


def test_c30_every_literal_block_that_is_not_python_is_a_known_diagram():
    not_code = {(m, b.splitlines()[0]) for m, _, b in EXAMPLES if not is_python(b)}
    assert not_code == NOT_CODE
    assert len(MODULES) >= 5 and sum(len(readme_examples(p)) for p in DOCS) >= 2


@pytest.mark.parametrize("module", MODULES)
async def test_c30_the_docstring_examples_of_each_module_run(module, harness):
    namespace = {**PUBLIC, **vars(importlib.import_module(module)), "h": harness}
    for _, where, block in [e for e in EXAMPLES if e[0] == module and is_python(e[2])]:
        await run_example(block, namespace, where)
    plt.close("all")


@pytest.mark.parametrize("path", [p for p in DOCS if readme_examples(p)], ids=lambda p: p.name)
async def test_c30_the_readme_and_docs_python_examples_run_in_order(harness, path):
    namespace = {**PUBLIC, "h": harness}
    for n, block in enumerate(readme_examples(path), 1):
        await run_example(block, namespace, f"{path.name} python block {n}")
    plt.close("all")


async def test_c30_the_harness_module_example_opens_and_drops_its_database():
    """The case's own input: ``async with Harness.open(...)`` raised TypeError (a coroutine is not a
    context manager); the example now awaits it, and the database goes with the block."""
    from agentlab.runtime import db

    async with await Harness.open(purpose="c30") as h:
        name = db.dbname_of(h.url)
        assert name in db.list_databases()
    assert name not in db.list_databases()
