"""agentlab: keeping a database correct while an AI agent calls tools against it.

The public names are re-exported here; ``tests/test_public_api.py`` keeps ``__all__`` in step.
"""

import logging as _logging

from agentlab.batches import batch_frame, customer_rows, new_customer, steps_frame, tool_calls
from agentlab.db import DatabaseUnavailable, create_database, drop_database, server_url
from agentlab.errors import (
    AgentlabError, Category, NotFound, ToolError, UnknownTool, find_leaks, is_infrastructure, translate,
)
from agentlab.events import EventLog
from agentlab.graph import AgentState, build_graph, repair_orphans, retry_policy, run_config, unanswered_tool_calls
from agentlab.harness import Episode, Harness
from agentlab.model import ScriptedChatModel, load_model
from agentlab.node import BatchResult, CallResult, Outcome, TransactionalToolsNode, idempotency_key
from agentlab.outbox import DrainStats, OutboxWorker, outbox_counts
from agentlab.provider import Clock, FakePaymentProvider, IdempotencyConflict, ProviderTimeout, ProviderUnavailable
from agentlab.safeguards import PRESET_NOTES, PRESETS, Policy, Safeguards, preset
from agentlab.scenarios import SCENARIOS, C, CustomerSpec, Intended, PlannedCall, Scenario, get_scenario
from agentlab.tools import TOOLS, ToolSpec, get_tool, tool_schemas

_logging.getLogger("agentlab").addHandler(_logging.NullHandler())

__all__ = [
    "AgentState", "AgentlabError", "BatchResult", "C", "CallResult", "Category", "Clock", "CustomerSpec",
    "DatabaseUnavailable", "DrainStats", "Episode", "EventLog", "FakePaymentProvider", "Harness",
    "IdempotencyConflict", "Intended", "NotFound", "OutboxWorker", "Outcome", "PRESETS", "PRESET_NOTES",
    "PlannedCall", "Policy", "ProviderTimeout", "ProviderUnavailable", "SCENARIOS", "Safeguards", "Scenario",
    "ScriptedChatModel", "TOOLS", "ToolError", "ToolSpec", "TransactionalToolsNode", "UnknownTool",
    "build_graph", "create_database", "drop_database", "find_leaks", "get_scenario", "get_tool",
    "idempotency_key", "is_infrastructure", "load_model", "outbox_counts", "preset", "repair_orphans",
    "retry_policy", "run_config", "server_url", "tool_schemas", "translate", "unanswered_tool_calls",
    "batch_frame", "customer_rows", "new_customer", "steps_frame", "tool_calls",
]
