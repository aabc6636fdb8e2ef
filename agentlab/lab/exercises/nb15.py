"""Kept import path: notebook 15's exercises moved to :mod:`agentlab.course.exercises.nb15`."""

from agentlab.course.exercises.nb15 import EXERCISES, TENANTS  # noqa: F401 (kept import path)
