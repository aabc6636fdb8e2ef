"""Kept import path: notebook 03's exercises moved to :mod:`agentlab.course.exercises.nb03`."""

from agentlab.course.exercises.nb03 import (  # noqa: F401 (kept import path)
    EXERCISES,
    REFUSED,
    TRANSFERS,
    verify_transfers,
)
