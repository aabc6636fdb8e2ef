"""Kept import path: notebook 08's exercises moved to :mod:`agentlab.course.exercises.nb08`."""

from agentlab.course.exercises.nb08 import EXERCISES  # noqa: F401 (kept import path)
