"""The domain-agnostic pattern: translator, messages, safeguards, isolation, tool specs, ledger, outbox, events, the tools node, the graph."""
