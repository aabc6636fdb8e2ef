"""A model reply that cannot become an AIMessage (case C47): read it, or end the turn with one clear error.

A chat model's client turns the server's JSON into an ``AIMessage`` inside ``ainvoke``. A reply of an
unexpected shape makes the client raise there, before the graph has anything to store: through
``langchain_openai.ChatOpenAI``, tool call arguments that are a JSON array (``"[9, 100]"``), a string,
a number or ``true`` raise pydantic's ``ValidationError`` (the AIMessage wants an object); ``"choices":
[]`` raises ``IndexError``; ``"message": null`` raises ``AttributeError``; a body that is not JSON
raises ``JSONDecodeError``. Left alone, the exception escapes the agent node, the checkpoint still points
at the agent, and every resume asks the same model the same question and gets the same reply.

:func:`read_reply` calls the model at most ``attempts`` times. When the client raises an error of
:data:`READ_ERRORS` (or the reply is some other message than an AIMessage, e.g. a ``"role": "user"``
message), the next attempt is sent the same history plus one note naming what was wrong and what to send
instead (:data:`RETRY_NOTE`; the note is never stored). When no attempt reads, the turn ends with one
AIMessage reading ``MODEL ERROR: ...`` (:data:`MODEL_ERROR_TEMPLATE`) that names the reply's shape. The
unreadable reply never enters the history, so nothing of it runs, no tool call of it waits for an
answer, and the history keeps every provider rule (:mod:`agentlab.core.provider_rules`): the thread
takes the next user message as usual.

Errors the client raises for the *transport* (langchain-core's ``ModelError``: connection refused, HTTP
4xx / 5xx, timeouts; ``openai.OpenAIError``) are not unreadable replies: they propagate, as before, and
a resume asks again. So do the kit's own errors and anything not in :data:`READ_ERRORS`.

The shape is named from what the client raised: pydantic's error location and input for a message field
(``tool call 1's arguments are an array ([9, 100]), not a JSON object``), langchain-openai's own texts
for the body, and for a bare ``AttributeError`` / ``TypeError`` the client function that met it
(:data:`CLIENT_PARTS`, checked by the C47 tests against the installed langchain-openai).

Sources: langchain-openai ``_create_chat_result`` / ``_convert_dict_to_message``, langchain-core
``parse_tool_call`` and ``AIMessage`` (``tool_calls[].args: dict``), ``langchain_core.exceptions.ModelError``.
"""

from __future__ import annotations

import json
import os
import re
import sys
import traceback
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage

REPLY_ATTEMPTS = 2  # model calls per turn when replies cannot be read: the first and one retry with a note

RETRY_NOTE = "Your last reply could not be read: {shape}. Nothing of it was applied. Reply again; {instead}."
MODEL_ERROR_TEMPLATE = ("MODEL ERROR: the model's reply could not be read ({attempts} attempts): {shape}. Nothing "
                        "of it was applied; send the request again, or use another model.")

# what to send instead, by what was wrong (model-facing)
SEND_ARGUMENTS_OBJECT = ("send each tool call's arguments as one JSON object that maps each of the tool's argument "
                         "names to its value, never an array, a string, a number or a boolean")
SEND_ARGUMENTS_TEXT = "send each tool call's arguments as a string holding one JSON object"
SEND_TOOL_NAME = "name each tool call's function by one of the tools' names, as a string"
SEND_CALL_ID = "give each tool call its own string id"
SEND_TEXT = "answer with plain text"
SEND_AGAIN = "send your reply again as one assistant message"

# the client function (innermost frame of the traceback) that met a bare AttributeError / TypeError ->
# the part of the reply it was reading; langchain-openai's names, see the module docstring
CLIENT_PARTS = {
    "_convert_dict_to_message": 'a choice\'s "message" is {kind}, not an object',
    "_create_chat_result": 'an entry of "choices" is {kind}, not an object',
    "make_invalid_tool_call": 'a tool call\'s "function" is {kind}, not an object',
    "parse_tool_call": 'a tool call\'s "function" is {kind}, not an object',
    "_backwards_compat_tool_calls": 'the message\'s "tool_calls" is not a list of calls',
    "_convert_delta_to_message_chunk": 'a streamed "delta" holds {kind} where an object belongs',
}
_OBJECT_KIND = re.compile(r"^'(\w+)' object (?:has no attribute|is not subscriptable)|^(string) indices must be")
_KIT_DIR = str(Path(__file__).resolve().parent.parent) + os.sep
_RESPONSE_TYPE = re.compile(r"Unexpected response type .*? got (\w+): (.*)$", re.DOTALL)


@dataclass(frozen=True)
class Unreadable:
    """One reply that could not become an AIMessage: ``shape`` names what was wrong (one line, for people
    and the model), ``instead`` says what to send instead, ``error`` is the client's exception class."""

    shape: str
    instead: str
    error: str


@dataclass(frozen=True)
class Reply:
    """What :func:`read_reply` got: ``message`` is the model's AIMessage, or the ``MODEL ERROR`` one when no
    attempt could be read (then ``error`` holds its text); ``failures`` are the attempts that could not be
    read, in order."""

    message: AIMessage
    failures: tuple[Unreadable, ...] = ()
    error: str | None = None


def json_kind(value: Any) -> str:
    """``value`` as JSON names its kind: ``an array``, ``a string``, ``null``, ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return {int: "a number", float: "a number", str: "a string", list: "an array", tuple: "an array",
            dict: "an object"}.get(type(value), f"a {type(value).__name__}")


_ROLES = {"human": "user", "system": "system", "tool": "tool", "function": "function"}  # message type -> role
_PY_KINDS = {"NoneType": "null", "str": "a string", "string": "a string", "list": "an array", "int": "a number",
             "float": "a number", "bool": "a boolean", "dict": "an object"}


def _preview(value: Any, limit: int = 60) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except ValueError:
        text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _from_validation(exc: Exception) -> tuple[str, str]:
    """A message field of the wrong type (pydantic's first error: its location and input)."""
    first = exc.errors()[0]
    loc, value = tuple(first.get("loc", ())), first.get("input")
    got = "null" if value is None else f"{json_kind(value)} ({_preview(value)})"
    if len(loc) >= 3 and loc[0] in ("tool_calls", "invalid_tool_calls", "tool_call_chunks") and isinstance(loc[1], int):
        n, field = loc[1] + 1, loc[2]
        if field == "args" and loc[0] == "tool_calls":
            return f"tool call {n}'s arguments are {got}, not a JSON object", SEND_ARGUMENTS_OBJECT
        if field == "args":
            return f"tool call {n}'s arguments are {got}, not a string holding JSON", SEND_ARGUMENTS_TEXT
        if field == "name":
            return f"tool call {n}'s function name is {got}, not a string", SEND_TOOL_NAME
        if field == "id":
            return f"tool call {n}'s id is {got}, not a string", SEND_CALL_ID
        return f"tool call {n}'s {field} is {got}", SEND_AGAIN
    if loc and loc[0] == "content":
        return f"the message content is {got}, not text", SEND_TEXT
    if loc and loc[0] == "role":
        return f"the message's role is {got}, not 'assistant'", SEND_AGAIN
    where = ".".join(map(str, loc)) or "message"
    return f"the {getattr(exc, 'title', 'message')}'s {where} is {got}: {first.get('msg', '')}", SEND_AGAIN


def _from_value_error(exc: Exception) -> tuple[str, str]:
    """langchain-openai's ValueErrors about the body; a JSON body that did not parse."""
    response = getattr(exc, "response", None)  # langchain-openai attaches it when parsing the body failed
    if isinstance(exc, json.JSONDecodeError):
        ctype, text = "", ""
        if response is not None:
            ctype = str(response.headers.get("content-type", ""))
            try:
                text = response.text
            except Exception:  # noqa: BLE001 - a body that cannot be decoded: named without its text
                text = ""
        body = f" ({ctype}: {_preview(text)})" if ctype or text else ""
        return f"the reply is not JSON{body}", SEND_AGAIN
    first = exc.args[0] if exc.args else ""
    if isinstance(first, dict):  # a body with an "error" member and HTTP 200
        detail = first.get("message", first)
        return f"the reply is an error, not a message: {_preview(detail, 120)}", SEND_AGAIN
    found = _RESPONSE_TYPE.search(str(first))
    if found:
        kind = _PY_KINDS.get(found.group(1), found.group(1))
        what = "not JSON" if kind == "a string" else f"{kind}, not a JSON object"
        return f"the reply is {what} ({found.group(2)[:60]})", SEND_AGAIN
    if "No generations found in stream" in str(first):
        return "the streamed reply holds no message (no choice with a delta)", SEND_AGAIN
    return f"the reply could not be read ({type(exc).__name__}: {str(exc)[:120]})", SEND_AGAIN


def _client_function(exc: BaseException) -> str | None:
    frames = traceback.extract_tb(exc.__traceback__)
    return next((f.name for f in reversed(frames) if f.name in CLIENT_PARTS), None)


def _from_lookup_or_type(exc: Exception) -> tuple[str, str]:
    """An IndexError, KeyError, TypeError or AttributeError the client met walking the body."""
    text = str(exc)
    if isinstance(exc, IndexError):
        return 'the reply holds no message (its "choices" list is empty)', SEND_AGAIN
    if isinstance(exc, KeyError):
        return f"the reply lacks {text}", SEND_AGAIN
    if "null value for 'choices'" in text:
        return 'the reply has no "choices" (null or missing)', SEND_AGAIN
    found = _OBJECT_KIND.search(text)
    kind = _PY_KINDS.get(next((g for g in found.groups() if g), ""), "") if found else ""
    part = CLIENT_PARTS.get(_client_function(exc) or "")
    if part and kind:
        return part.format(kind=kind), SEND_AGAIN
    return f"part of the reply is not what the client expects ({type(exc).__name__}: {text[:120]})", SEND_AGAIN


def _is_validation_error(exc: BaseException) -> bool:
    pydantic_core = sys.modules.get("pydantic_core")
    return pydantic_core is not None and isinstance(exc, pydantic_core.ValidationError)


def _is_response_validation_error(exc: BaseException) -> bool:
    openai = sys.modules.get("openai")  # not imported: the error is not its client's
    return openai is not None and isinstance(exc, openai.APIResponseValidationError)


def _from_response_validation(exc: Exception) -> tuple[str, str]:
    return f"the reply does not fit the chat completion schema ({str(exc)[:120]})", SEND_AGAIN


# what the client raises for a reply it cannot read, most specific first: (test, namer)
READ_ERRORS: tuple[tuple[Callable[[BaseException], bool], Callable[[Exception], tuple[str, str]]], ...] = (
    (_is_validation_error, _from_validation),
    (_is_response_validation_error, _from_response_validation),
    (lambda e: isinstance(e, ValueError), _from_value_error),
    (lambda e: isinstance(e, IndexError | KeyError | TypeError | AttributeError), _from_lookup_or_type),
)


def _transport_or_kit(exc: BaseException) -> bool:
    """Errors that are not about the reply's shape: the kit's own, the model API's (connection, status,
    timeout: langchain-core's ``ModelError``, ``openai.OpenAIError``) but a response that failed validation."""
    from langchain_core.exceptions import ModelError

    from agentlab.core.errors import AgentlabError

    openai = sys.modules.get("openai")
    api = openai is not None and isinstance(exc, openai.OpenAIError) and not _is_response_validation_error(exc)
    return isinstance(exc, AgentlabError | ModelError) or api


def _raised_in_the_kit(exc: BaseException) -> bool:
    """Whether the innermost frame of ``exc`` is the kit's own code (a model the kit wraps, a test model):
    a bug there is no reply of the model's."""
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and frames[-1].filename.startswith(_KIT_DIR)


def unreadable(exc: BaseException) -> Unreadable | None:
    """What ``exc``, raised by a model call, says about the reply; None when it is no unreadable reply
    (a transport error, the kit's own error or one raised in the kit's code, or a class outside
    :data:`READ_ERRORS`): the caller raises it."""
    if not isinstance(exc, Exception) or _transport_or_kit(exc) or _raised_in_the_kit(exc):
        return None
    for test, name in READ_ERRORS:
        if test(exc):
            shape, instead = name(exc)
            return Unreadable(shape, instead, type(exc).__name__)
    return None


def not_an_aimessage(reply: Any) -> Unreadable | None:
    """A reply the client did read, but as another kind of message than the assistant's (``"role": "user"``
    gives a HumanMessage); None for an AIMessage."""
    if isinstance(reply, AIMessage):
        return None
    role = getattr(reply, "role", None) or _ROLES.get(getattr(reply, "type", None), type(reply).__name__)
    return Unreadable(f"the reply's message has the role {role!r}, not 'assistant'", SEND_AGAIN, type(reply).__name__)


def model_error_message(failure: Unreadable, attempts: int) -> AIMessage:
    """The AIMessage that ends a turn no attempt of which could be read. It is the kit's, not the model's:
    ``response_metadata`` (never sent to a provider) says so under ``model_error``, with the client's
    exception class under ``error``."""
    text = MODEL_ERROR_TEMPLATE.format(attempts=attempts, shape=failure.shape)
    return AIMessage(content=text, response_metadata={"model_error": text, "error": failure.error})


async def read_reply(call: Callable[[list[AnyMessage]], Awaitable[Any]], messages: Sequence[AnyMessage], *,
                     attempts: int = REPLY_ATTEMPTS) -> Reply:
    """The model's reply to ``messages`` as an AIMessage, asking at most ``attempts`` times (see the module).

    Args:
        call: sends a history to the model and returns its reply (a new call each time).
        messages: the history to send; a retry gets it plus one :data:`RETRY_NOTE`, never stored.
        attempts: model calls at most (at least 1).

    Raises:
        whatever ``call`` raises that :func:`unreadable` does not recognise (transport errors, the kit's own).
    """
    failures: list[Unreadable] = []
    for _ in range(max(1, attempts)):
        sent = list(messages)
        if failures:
            sent.append(HumanMessage(RETRY_NOTE.format(shape=failures[-1].shape, instead=failures[-1].instead)))
        try:
            response = await call(sent)
        except Exception as exc:
            failure = unreadable(exc)
            if failure is None:
                raise
        else:
            failure = not_an_aimessage(response)
            if failure is None:
                return Reply(response, tuple(failures))
        failures.append(failure)
    message = model_error_message(failures[-1], max(1, attempts))
    return Reply(message, tuple(failures), error=message.content)
