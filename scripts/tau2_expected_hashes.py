#!/usr/bin/env python3
"""Ground truth for the retail port: replay every tau2 retail task with tau2's OWN code.

A maintainer script, outside the ``agentlab`` package and never imported by it. It writes
``data/retail/expected_hashes.json``, which the port's tests compare against.

How it runs tau2 without installing it (tau2 cannot be installed here, see
``/work/shared/tau2-retail/README.md``): it loads tau2's reference files
``domains__retail__data_model.py`` and ``domains__retail__tools.py`` from ``--reference`` as the
modules ``tau2.domains.retail.data_model`` and ``tau2.domains.retail.tools`` of a stand-in ``tau2``
package built in memory, with a few lines below standing in for what those two files import
(``tau2.environment.toolkit``: ``ToolKitBase``, ``is_tool``, ``ToolType``; ``tau2.environment.db``:
``DB``; ``tau2.domains.retail.utils``: the data paths). No tau2 code is copied into this repository.

What it does, per task (as ``EnvironmentEvaluator.calculate_reward`` builds its gold environment):
a fresh ``RetailDB`` from ``db.json``, then ``evaluation_criteria.actions`` in order through
``ToolKitBase.use_tool``, every exception swallowed and recorded (tau2 logs and swallows it), then
the hash of ``db.model_dump()``.

Two hashes per state:

- ``hashes`` (canonical): every float rounded to 2 decimals, recursively (a -0.0 made 0.0), then
  ``sha256(json.dumps(state, sort_keys=True, default=str))``. A port that keeps money in integer
  cents compares this one (tau2's floats carry values such as 17.98999999999998).
- ``tau2_hashes``: tau2's own ``get_hash`` on the raw floats, for reference.

Also: ``raised`` (task id -> the actions that raised, with tau2's error text), ``result_hashes``
(task id -> per action the canonical hash of what the tool returned, ``null`` where it raised), the
hash of the initial state and each tool's tau2 ``ToolType``.

Run it from the repository root::

    python scripts/tau2_expected_hashes.py                      # writes data/retail/expected_hashes.json
    python scripts/tau2_expected_hashes.py --reference DIR --data DIR --out FILE
    python scripts/tau2_expected_hashes.py --dump-states /tmp/tau2-states   # also each final state, to diff
"""

from __future__ import annotations

import argparse
import copy
import gzip
import hashlib
import importlib.util
import json
import sys
import time
import types
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

REPO = Path(__file__).resolve().parent.parent
DEFAULT_REFERENCE = Path("/work/shared/tau2-retail/reference")
DEFAULT_DATA = REPO / "data" / "retail"
SOURCE = {"repo": "sierra-research/tau2-bench", "commit": "a2c0247", "domain": "retail"}


# --------------------------------------------------------------------------- canonical hash

def round_floats(value: Any) -> Any:
    """``value`` with every float rounded to 2 decimals (-0.0 made 0.0), recursively through dicts and lists."""
    if isinstance(value, float):
        return round(value, 2) + 0.0  # + 0.0: -0.0 becomes 0.0
    if isinstance(value, dict):
        return {k: round_floats(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [round_floats(v) for v in value]
    return value


def raw_hash(state: Any) -> str:
    """tau2's hash (``tau2.utils.get_dict_hash``)."""
    return hashlib.sha256(json.dumps(state, sort_keys=True, default=str).encode()).hexdigest()


def canonical_hash(state: Any) -> str:
    """The port's comparison hash: floats rounded to 2 decimals, then tau2's hash."""
    return raw_hash(round_floats(state))


def has_unrounded_float(value: Any) -> bool:
    if isinstance(value, float):
        return round(value, 2) != value
    if isinstance(value, dict):
        return any(has_unrounded_float(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(has_unrounded_float(v) for v in value)
    return False


# --------------------------------------------------------------------------- the stand-in tau2 package

class ToolType(str, Enum):
    READ = "read"
    WRITE = "write"
    THINK = "think"
    GENERIC = "generic"


def is_tool(tool_type: ToolType = ToolType.READ, mutates_state: bool | None = None):
    def decorator(func):
        func.__tool__ = True
        func.__tool_type__ = tool_type
        func.__mutates_state__ = tool_type == ToolType.WRITE if mutates_state is None else mutates_state
        return func
    return decorator


class ToolKitBase:
    """What the retail toolkit needs of tau2's ToolKitBase: ``db``, ``tools``, ``use_tool``."""

    def __init__(self, db=None):
        self.db = db

    @property
    def tools(self) -> dict:
        return {name: getattr(self, name) for name in dir(type(self))
                if getattr(getattr(type(self), name, None), "__tool__", False)}

    def use_tool(self, tool_name: str, **kwargs):
        if tool_name not in self.tools:
            raise ValueError(f"Tool '{tool_name}' not found.")
        return self.tools[tool_name](**kwargs)


class DB(BaseModel):
    """tau2's DB is a BaseModelNoExtra (``extra="forbid"``) with ``load`` and ``get_hash``."""

    model_config = ConfigDict(extra="forbid")

    @classmethod
    def load(cls, path):
        return cls.model_validate(json.loads(Path(path).read_text()))

    def get_hash(self) -> str:
        return raw_hash(self.model_dump())


def load_tau2(reference: Path, data: Path) -> tuple[types.ModuleType, types.ModuleType]:
    """Build the stand-in ``tau2`` package and load tau2's data model and tools from ``reference``."""
    def module(name: str, **attrs) -> types.ModuleType:
        mod = types.ModuleType(name)
        mod.__path__ = []  # a package, so that submodules import
        mod.__dict__.update(attrs)
        sys.modules[name] = mod
        return mod

    module("tau2")
    module("tau2.environment")
    module("tau2.environment.toolkit", ToolKitBase=ToolKitBase, ToolType=ToolType, is_tool=is_tool)
    module("tau2.environment.db", DB=DB)
    module("tau2.domains")
    module("tau2.domains.retail")
    module("tau2.domains.retail.utils", RETAIL_DATA_DIR=data, RETAIL_DB_PATH=data / "db.json",
           RETAIL_POLICY_PATH=data / "policy.md", RETAIL_TASK_SET_PATH=data / "tasks.json")

    def load(name: str, filename: str) -> types.ModuleType:
        path = reference / filename
        if not path.exists():
            sys.exit(f"tau2 reference file not found: {path} (use --reference)")
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        return mod

    data_model = load("tau2.domains.retail.data_model", "domains__retail__data_model.py")
    tools = load("tau2.domains.retail.tools", "domains__retail__tools.py")
    return data_model, tools


# --------------------------------------------------------------------------- replay

def read_json(folder: Path, name: str) -> Any:
    """``folder/name``, or its ``.gz`` beside it."""
    plain, packed = folder / name, folder / f"{name}.gz"
    if plain.exists():
        return json.loads(plain.read_text())
    with gzip.open(packed, "rt", encoding="utf-8") as f:
        return json.load(f)


def replay(data_model, tools_mod, raw_db: dict, actions: list[dict]) -> tuple[dict, list[dict], list[str | None]]:
    """A fresh RetailDB, the actions in order (exceptions swallowed).

    Returns the final ``model_dump()``, the actions that raised, and per action the canonical hash of
    what it returned (a returned model as its ``model_dump()``), ``None`` where it raised.
    """
    db = data_model.RetailDB.model_validate(copy.deepcopy(raw_db))
    toolkit = tools_mod.RetailTools(db)
    raised, results = [], []
    for action in actions:
        try:
            result = toolkit.use_tool(action["name"], **action["arguments"])
        except Exception as exc:  # noqa: BLE001 - tau2's evaluator swallows every exception
            raised.append({"action_id": action["action_id"], "name": action["name"],
                           "error": f"{type(exc).__name__}: {exc}"})
            results.append(None)
        else:
            results.append(canonical_hash(result.model_dump() if isinstance(result, BaseModel) else result))
    return toolkit.db.model_dump(), raised, results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", type=Path, default=DEFAULT_REFERENCE,
                        help=f"folder of tau2's reference files (default {DEFAULT_REFERENCE})")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA,
                        help="folder holding db.json(.gz) and tasks.json(.gz) (default data/retail)")
    parser.add_argument("--out", type=Path, default=DEFAULT_DATA / "expected_hashes.json")
    parser.add_argument("--dump-states", type=Path, metavar="DIR",
                        help="also write each final state (floats rounded) to DIR/<task id>.json, to diff a port against")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    data_model, tools_mod = load_tau2(args.reference, args.data)
    raw_db = read_json(args.data, "db.json")
    tasks = read_json(args.data, "tasks.json")

    toolkit = tools_mod.RetailTools(data_model.RetailDB.model_validate(copy.deepcopy(raw_db)))
    tool_types = {name: getattr(fn, "__tool_type__").value for name, fn in sorted(toolkit.tools.items())}
    initial = toolkit.db.model_dump()

    hashes, tau2_hashes, raised, unrounded, result_hashes = {}, {}, {}, [], {}
    for task in tasks:
        actions = (task.get("evaluation_criteria") or {}).get("actions") or []
        state, errors, results = replay(data_model, tools_mod, raw_db, actions)
        hashes[task["id"]] = canonical_hash(state)
        result_hashes[task["id"]] = results
        tau2_hashes[task["id"]] = raw_hash(state)
        if errors:
            raised[task["id"]] = errors
        if has_unrounded_float(state):
            unrounded.append(task["id"])
        if args.dump_states:
            args.dump_states.mkdir(parents=True, exist_ok=True)
            (args.dump_states / f"{task['id']}.json").write_text(json.dumps(round_floats(state), sort_keys=True))

    out = {
        "source": SOURCE,
        "generated_by": "scripts/tau2_expected_hashes.py",
        "canonical_hash": "sha256(json.dumps(state, sort_keys=True, default=str)) of db.model_dump() "
                          "with every float rounded to 2 decimals (and -0.0 made 0.0), recursively",
        "initial_hash": canonical_hash(initial),
        "initial_tau2_hash": raw_hash(initial),
        "tools": tool_types,
        "hashes": hashes,
        "raised": raised,
        "tasks_with_unrounded_floats": unrounded,
        "tau2_hashes": tau2_hashes,
        "result_hashes": result_hashes,
    }
    args.out.write_text(json.dumps(out, indent=1, sort_keys=False) + "\n")
    n_raised = sum(len(v) for v in raised.values())
    print(f"{len(tasks)} tasks, {sum(len((t.get('evaluation_criteria') or {}).get('actions') or []) for t in tasks)} "
          f"golden actions, {n_raised} raised in {len(raised)} tasks, "
          f"{sum(h == out['initial_hash'] for h in hashes.values())} end in the initial state, "
          f"{len(set(hashes.values()))} distinct end states, {len(unrounded)} hold unrounded floats; "
          f"wrote {args.out} in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
