"""Stories on a Harness for the notebooks and ``python -m agentlab demo``."""
