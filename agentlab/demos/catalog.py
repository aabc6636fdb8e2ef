"""The demos' names, importable without LangGraph (the command line's parser lists them)."""

from __future__ import annotations

WORKFLOW_DEMOS = ("approval", "saga")  # beyond one transaction: agentlab.demos.workflows
