"""Kept import path: notebook 07's exercises moved to :mod:`agentlab.course.exercises.nb07`."""

from agentlab.course.exercises.nb07 import (  # noqa: F401 (kept import path)
    CRASHED_THREAD,
    EXERCISES,
    LEDGER_REPORT_COLUMNS,
    crashed_thread,
    rows_by_tool,
)
