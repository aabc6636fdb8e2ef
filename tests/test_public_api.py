"""``agentlab.__all__`` stays in step with the names the package re-exports."""

import types

import agentlab


def test_all_lists_exactly_the_public_reexports():
    public = {n for n, v in vars(agentlab).items() if not n.startswith("_") and not isinstance(v, types.ModuleType)}
    assert sorted(agentlab.__all__) == sorted(public)
    assert len(agentlab.__all__) == len(set(agentlab.__all__))
