"""Domains the safety net protects: each bundles its schema, tools, seed data, scenarios and invariants."""
