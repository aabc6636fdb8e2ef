"""The benchmark behind ``python -m agentlab bench``."""
