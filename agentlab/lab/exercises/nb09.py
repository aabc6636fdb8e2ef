"""Kept import path: notebook 09's exercises moved to :mod:`agentlab.course.exercises.nb09`."""

from agentlab.course.exercises.nb09 import (  # noqa: F401 (kept import path)
    EXERCISES,
    NEMESIS_HINTS,
    NEMESIS_KINDS,
    NEMESIS_PRESETS,
)
