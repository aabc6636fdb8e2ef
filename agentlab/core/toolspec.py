"""Tool specs and toolsets: what the tools node needs to know about a tool, for any domain.

A tool is a strict pydantic argument model (``strict=True``, ``extra="forbid"``; the class is named
after the tool and its docstring is the tool's description, so it is also the LangChain schema), an
async handler that runs on the node's connection inside the batch's transaction and never commits,
and two facts the safety net acts on: whether it writes, and whether it reaches outside (through the
outbox, :mod:`agentlab.core.outbox`).

A :class:`Toolset` is an immutable mapping from tool name to :class:`ToolSpec`. It refuses, when it
is built, what would go wrong later: two tools with one name, or an argument model that is not strict.

Source: pydantic "Strict Mode" and ``ConfigDict(extra="forbid")``; LangChain ``bind_tools`` /
``convert_to_openai_tool``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, field_validator

from agentlab.core.errors import DomainError, UnknownTool
from agentlab.core.storable import UNSTORABLE_REASON, unstorable_path

if TYPE_CHECKING:
    from psycopg import AsyncConnection

    from agentlab.core.safeguards import Safeguards


class StrictArgs(BaseModel):
    """Base of a strict argument model: no coercion (``"42"`` is not an int), no unknown keys, frozen,
    and no text the database cannot store (a NUL byte, a lone surrogate) in any field, at any depth:
    such a value is refused here, before any SQL, with the field named (case C21)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        if unstorable_path(value) is not None:
            raise ValueError(UNSTORABLE_REASON)
        return value


@dataclass
class ToolContext:
    """What a handler knows besides its arguments. The tenant comes from the graph's config.

    ``provider`` is the payment provider a first-draft tool calls inline when the outbox is off (the
    kit's :class:`agentlab.sim.provider.FakePaymentProvider`); None under the outbox.
    """

    thread_id: str
    tool_call_id: str
    safeguards: Safeguards
    provider: Any = None
    tenant_id: str | None = None


Handler = Callable[["AsyncConnection", Mapping[str, Any], ToolContext], Awaitable[Any]]


@dataclass(frozen=True)
class ToolSpec:
    """One tool: its name, argument model, handler, whether it writes or reaches the outside world, and its
    time budget.

    ``timeout_ms``: each statement of a call of this tool is cancelled once it has run this many
    milliseconds, and the call is answered ``FAILED [timeout]`` (:mod:`agentlab.core.batch.timeouts`);
    None: the batch's ``statement_timeout`` (``Safeguards.statement_timeout_ms``).

    Raises:
        DomainError: ``timeout_ms`` is not a whole number of milliseconds above zero.
    """

    name: str
    args_model: type[BaseModel]
    handler: Handler
    writes: bool
    external: bool = False
    description: str = field(default="")
    timeout_ms: int | None = None

    def __post_init__(self) -> None:
        t = self.timeout_ms
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or t <= 0):
            raise DomainError(
                f"tool {self.name!r}: timeout_ms must be a whole number of milliseconds above zero, got {t!r}; "
                "leave it None for the batch's statement_timeout")

    @property
    def arg_names(self) -> tuple[str, ...]:
        return tuple(self.args_model.model_fields)

    def validate(self, args: Any) -> dict:
        """Validate ``args``; return them as a dict of Python values. Raises pydantic.ValidationError."""
        return self.args_model.model_validate(dict(args) if isinstance(args, Mapping) else args).model_dump()


def tool(args_model: type[BaseModel], handler: Handler, *, writes: bool, external: bool = False,
         name: str | None = None, timeout_ms: int | None = None) -> ToolSpec:
    """A :class:`ToolSpec` named after its argument model (or ``name``), described by its docstring, with
    ``timeout_ms`` as its time budget (None: the batch's). Raises DomainError for a budget of zero or less."""
    return ToolSpec(name or args_model.__name__, args_model, handler, writes, external,
                    (args_model.__doc__ or "").strip(), timeout_ms)


def _check_strict(spec: ToolSpec) -> None:
    config = spec.args_model.model_config
    if config.get("extra") != "forbid" or not config.get("strict"):
        raise DomainError(
            f"tool {spec.name!r}: its argument model {spec.args_model.__name__} is not strict; give it "
            "model_config = ConfigDict(strict=True, extra='forbid') (or subclass agentlab.StrictArgs)")


class Toolset(Mapping[str, ToolSpec]):
    """An immutable mapping of tool name -> :class:`ToolSpec`, in the order given.

    Raises:
        DomainError: two tools share a name, or an argument model is not strict.
    """

    def __init__(self, specs: Iterable[ToolSpec]):
        tools: dict[str, ToolSpec] = {}
        for spec in specs:
            if spec.name in tools:
                raise DomainError(f"two tools are named {spec.name!r}; each tool needs its own name")
            _check_strict(spec)
            tools[spec.name] = spec
        self._tools = tools
        self._schemas: list[dict] | None = None

    def __getitem__(self, name: str) -> ToolSpec:
        return self._tools[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    def __repr__(self) -> str:
        return f"Toolset({', '.join(self._tools)})"

    def get_tool(self, name: Any) -> ToolSpec:
        """The tool named ``name``. Raises UnknownTool (model-facing, lists the known tools)."""
        spec = self._tools.get(name) if isinstance(name, str) else None
        if spec is None:
            raise UnknownTool(f"there is no such tool; use one of: {', '.join(self._tools)}.")
        return spec

    def schemas(self) -> list[dict]:
        """The tools in OpenAI function format for ``bind_tools``, converted once from the argument models
        (LangChain reads each name and description from its model). A list of new dicts per call."""
        if self._schemas is None:
            from langchain_core.utils.function_calling import convert_to_openai_tool

            self._schemas = []
            for spec in self._tools.values():
                schema = convert_to_openai_tool(spec.args_model)
                schema["function"]["name"] = spec.name
                self._schemas.append(schema)
        return copy.deepcopy(self._schemas)

    def writers(self) -> tuple[str, ...]:
        """The names of the tools that write."""
        return tuple(n for n, s in self._tools.items() if s.writes)


def result_content(result: Any) -> str:
    """The ToolMessage content of an applied call: its result as compact, key-sorted JSON."""
    return json.dumps(result, sort_keys=True, default=str, separators=(",", ":"))
