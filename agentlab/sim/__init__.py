"""The simulated outside world: the scripted chat model, the fake payment provider, the notifier."""
