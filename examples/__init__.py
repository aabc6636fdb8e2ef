"""Example domains outside the package: bring your own tool (``python -m agentlab chaos --domain examples.payouts:DOMAIN``)."""
