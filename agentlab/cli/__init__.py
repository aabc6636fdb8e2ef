"""The command line: ``python -m agentlab``."""
