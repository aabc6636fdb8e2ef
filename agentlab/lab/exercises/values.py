"""Kept import path: the values' comparison moved to :mod:`agentlab.course.exercises.values`."""

from agentlab.course.exercises.values import described, same, shown  # noqa: F401 (kept import path)
