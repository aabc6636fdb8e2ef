"""A run's trace read back for a notebook: the spans as a frame, parents first, and as a waterfall chart."""

from __future__ import annotations

import matplotlib

from agentlab import span_frame, trace_waterfall, traced_episode
from agentlab.core import tracing

matplotlib.use("Agg")


async def test_a_traced_episode_gives_its_spans_as_a_frame_and_a_waterfall_and_leaves_tracing_off(harness):
    episode, spans = await traced_episode(harness, "refund", "full")

    frame = span_frame(spans)
    assert list(frame["span"]) == ["invoke_agent agentlab", "chat", *[f"execute_tool {t}" for t in (
        "CreateCreditMemo", "ApplyCredit", "QueueRefund")], "chat", *[f"execute_tool {t}" for t in (
        "CreateCreditMemo", "ApplyCredit", "QueueRefund")], "chat"]
    assert list(frame["depth"]) == [0] + [1] * 9 and frame["start_ms"].is_monotonic_increasing
    assert list(frame["outcome"].dropna()) == ["not_applied", "not_applied", "failed", "applied", "applied", "applied"]
    assert frame["tool_call_id"].dropna().str.startswith("call_").all()
    fig = trace_waterfall(frame)
    assert len(fig.axes[0].patches) == len(frame) and episode.error is None
    assert not tracing.enabled(), "the switch is as it was before the traced episode"
