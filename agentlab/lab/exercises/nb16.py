"""Kept import path: notebook 16's exercises moved to :mod:`agentlab.course.exercises.nb16`."""

from agentlab.course.exercises.nb16 import (  # noqa: F401 (kept import path)
    DOMAIN_HINT,
    EXERCISES,
    HARNESS_HINT,
    PER_PAYOUT_HINT,
    SWAP_PAYMENT,
)
