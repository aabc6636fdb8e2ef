"""``agentlab.__all__`` stays in step with the names the package re-exports, each loaded on first use."""

import subprocess
import sys
import types

import agentlab


def test_all_lists_exactly_the_public_reexports():
    exported = [name for names in agentlab._EXPORTS.values() for name in names]
    assert sorted(agentlab.__all__) == sorted(exported)
    assert len(agentlab.__all__) == len(set(agentlab.__all__))
    for name in agentlab.__all__:
        value = getattr(agentlab, name)  # resolves from its module
        assert not isinstance(value, types.ModuleType), name
        assert value is getattr(sys.modules[agentlab._MODULE_OF[name]], name)


def test_star_import_and_unknown_names():
    ns: dict = {}
    exec("from agentlab import *", ns)
    assert set(agentlab.__all__) <= set(ns)
    try:
        agentlab.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("an unknown name must raise AttributeError")


def test_importing_the_package_loads_no_heavy_library():
    code = "import sys, agentlab; print(sorted(m for m in ('langgraph', 'pandas', 'matplotlib') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.strip() == "[]"
