"""Beyond one transaction: sagas, jobs, human approval, history (replay, fork), retention."""
