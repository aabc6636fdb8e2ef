"""The demos' names, importable without LangGraph (the command line's parser lists them)."""

from __future__ import annotations

WORKFLOW_DEMOS = ("approval", "saga")  # beyond one transaction: agentlab.demos.workflows

STORY_DOMAIN = "billing"  # the domain whose stories ``demo`` tells (with the workflow demos and --model)


def story_names() -> list[str]:
    """The names ``demo`` takes for :data:`STORY_DOMAIN`: its scenarios and the workflow demos, sorted."""
    from agentlab.runtime.domains import resolve_domain

    return sorted([*resolve_domain(STORY_DOMAIN).scenarios, *WORKFLOW_DEMOS])
