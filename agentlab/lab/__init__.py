"""The failure lab: faults, invariants, the episode runner, experiments, the session and widget, charts."""
