"""Kept import path: notebook 04's exercises moved to :mod:`agentlab.course.exercises.nb04`."""

from agentlab.course.exercises.nb04 import EXERCISES, NOTHING, trace_batch  # noqa: F401 (kept import path)
