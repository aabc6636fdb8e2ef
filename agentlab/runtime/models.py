"""A real chat model by name: a hosted provider, or any OpenAI-compatible server (Ollama, vLLM, llama.cpp).

The scripted model (:class:`agentlab.sim.model.ScriptedChatModel`) stays the default everywhere; this
module is only for a user who wants the same safety net under a model that decides for itself.

- ``load_model("openai:gpt-4o-mini")``: OpenAI, the key read from ``OPENAI_API_KEY``.
- ``load_model("openai:qwen2.5:7b", base_url="http://localhost:11434/v1")``: Ollama (or vLLM on
  ``:8000/v1``, ``llama-server`` on ``:8080/v1``) through ``langchain-openai``'s ``ChatOpenAI``. A local
  server needs no key: the client gets the placeholder :data:`LOCAL_PLACEHOLDER_KEY`. With a
  ``base_url`` the kit never hands your ``OPENAI_API_KEY`` to that server; a server that wants a key of
  its own gets the one in the environment variable you name (``api_key_env="VLLM_API_KEY"``).

Errors are :class:`ModelUnavailable`, one line that never holds a key: the package is missing, the
name or URL is malformed, the key's variable is unset (named, never shown), the server cannot be
reached (:func:`probe_model`) or refused the key. :func:`describe_model_error` turns what the client
raises during a run into such a line.

Sources: langchain-openai ``ChatOpenAI`` (``base_url``, ``api_key``, ``timeout``, ``max_retries``);
the OpenAI API reference ("List models", ``GET /v1/models``), which Ollama, vLLM and llama.cpp serve too.
"""

from __future__ import annotations

import importlib
import os
import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from agentlab.core.errors import AgentlabError
from agentlab.core.redact import redact

LOCAL_PLACEHOLDER_KEY = "not-needed"  # what a local server gets for a key: it checks none
DEFAULT_TIMEOUT_S = 120.0  # one model call, seconds (a local model on a laptop can be slow)
DEFAULT_MAX_RETRIES = 2  # the client's own retries of a failed HTTP request
PROBE_TIMEOUT_S = 5.0
OPENAI_BASE_URL = "https://api.openai.com/v1"

PROVIDER_PACKAGES = {
    "openai": ("langchain_openai", "ChatOpenAI"),
    "anthropic": ("langchain_anthropic", "ChatAnthropic"),
    "google_genai": ("langchain_google_genai", "ChatGoogleGenerativeAI"),
    "mistralai": ("langchain_mistralai", "ChatMistralAI"),
    "groq": ("langchain_groq", "ChatGroq"),
    "ollama": ("langchain_ollama", "ChatOllama"),
}
KEY_VARIABLES = {
    "openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY", "google_genai": "GOOGLE_API_KEY",
    "mistralai": "MISTRAL_API_KEY", "groq": "GROQ_API_KEY",
}
# key-like runs an error text may carry (OpenAI echoes part of a refused key): never printed
_KEY_LIKE = re.compile(r"\b(?:sk|rk|pk)-[A-Za-z0-9_*.-]{4,}|[A-Za-z0-9_-]*\*{3,}[A-Za-z0-9_-]*")


class ModelUnavailable(AgentlabError):
    """Raised when a real model cannot be used: its package is missing, its name, URL or key is wrong, or
    its server cannot be reached or refused the key. The message is one line and holds no key."""


def safe_url(url: str) -> str:
    """``url`` as the kit prints it: scheme, host, port and path, without user, password, query or fragment."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(not shown: it does not parse)"
    return urlunsplit((parts.scheme, host + port, parts.path, "", ""))


def _check_base_url(base_url: str) -> str:
    try:
        parts = urlsplit(base_url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError:
        ok = False
    if not ok:
        raise ModelUnavailable("the model server URL must look like http://HOST:PORT/v1 (e.g. "
                               f"http://localhost:11434/v1 for Ollama); got {safe_url(base_url)}")
    return base_url.rstrip("/")


def load_model(name: str, *, base_url: str | None = None, api_key_env: str | None = None,
               timeout_s: float = DEFAULT_TIMEOUT_S, max_retries: int = DEFAULT_MAX_RETRIES, **kwargs: Any):
    """A real LangChain chat model by ``"provider:model"``.

    Args:
        name: ``"openai:gpt-4o-mini"``, ``"anthropic:claude-sonnet-4-5"``, ...; with ``base_url``,
            ``"openai:MODEL"`` names the model as the server knows it (``"openai:qwen2.5:7b"``; only the
            first colon splits).
        base_url: an OpenAI-compatible server's ``/v1`` URL (Ollama ``http://localhost:11434/v1``, vLLM
            ``http://localhost:8000/v1``, llama.cpp ``http://localhost:8080/v1``). Only with the
            ``openai`` provider (or ``ollama``, whose own package takes the server's root URL).
        api_key_env: the environment variable holding the key (default: the provider's usual one, e.g.
            ``OPENAI_API_KEY``; with ``base_url``, none: the server gets :data:`LOCAL_PLACEHOLDER_KEY`).
        timeout_s: seconds one model request may take; ``max_retries``: the client's retries of it.
        kwargs: passed to the model's class (``temperature=0``, ...).

    Returns:
        a ``BaseChatModel`` with ``bind_tools`` (``ChatOpenAI`` for ``openai``). Nothing is sent yet; see
        :func:`probe_model` to learn at once whether the server answers.

    Raises:
        ModelUnavailable: a name without ``provider:``, an unknown provider, its package not installed,
            a malformed ``base_url``, or the key's variable unset (named, never its value).
    """
    provider, _, model = name.partition(":")
    if not model or not provider:
        raise ModelUnavailable(f"model name {name!r} must look like 'provider:model', e.g. 'openai:gpt-4o-mini' "
                               "(the scripted model is the default: give no model for it)")
    if provider not in PROVIDER_PACKAGES:
        raise ModelUnavailable(f"unknown model provider {provider!r}; known: {', '.join(PROVIDER_PACKAGES)} "
                               "(an OpenAI-compatible server is 'openai:MODEL' with a base URL)")
    if base_url is not None and provider not in ("openai", "ollama"):
        raise ModelUnavailable(f"a base URL is for an OpenAI-compatible server ('openai:MODEL'); {provider!r} "
                               "reaches its own service")
    module_name, class_name = PROVIDER_PACKAGES[provider]
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        raise ModelUnavailable(
            f"model provider {provider!r} needs its package: pip install {module_name.replace('_', '-')}"
        ) from None
    options: dict[str, Any] = {"model": model, **kwargs}
    if provider == "ollama":  # langchain-ollama: the server's root URL, no key
        if base_url is not None:
            options["base_url"] = _check_base_url(base_url).removesuffix("/v1")
        return getattr(module, class_name)(**options)
    variable = api_key_env or (None if base_url is not None else KEY_VARIABLES.get(provider))
    if variable is not None and not os.environ.get(variable):
        where = f"the server at {safe_url(base_url)}" if base_url else f"{provider!r}"
        raise ModelUnavailable(f"{where} needs a key in the environment variable {variable}, which is not set"
                               + ("" if base_url else "; for a local server give a base URL instead"))
    from pydantic import SecretStr

    options.update(timeout=timeout_s, max_retries=max_retries)
    if variable is not None:
        options["api_key"] = SecretStr(os.environ[variable])
    if base_url is not None:
        options["base_url"] = _check_base_url(base_url)
        options.setdefault("api_key", SecretStr(LOCAL_PLACEHOLDER_KEY))
    return getattr(module, class_name)(**options)


def model_base_url(model) -> str | None:
    """The HTTP base URL ``model`` talks to (``ChatOpenAI``'s ``openai_api_base``, OpenAI's own when
    unset; ``ChatOllama``'s ``base_url``), or None for a model with none (the scripted one)."""
    if type(model).__name__ == "ChatOpenAI":
        return getattr(model, "openai_api_base", None) or OPENAI_BASE_URL
    url = getattr(model, "base_url", None)
    return url if isinstance(url, str) else None


def _secrets_of(model) -> list[str]:
    out = []
    for attr in ("openai_api_key", "anthropic_api_key", "api_key"):
        value = getattr(model, attr, None)
        if value is not None and hasattr(value, "get_secret_value"):
            value = value.get_secret_value()
        if isinstance(value, str) and value and value != LOCAL_PLACEHOLDER_KEY:
            out.append(value)
    return out


def scrub(text: str, model=None) -> str:
    """``text`` with the model's key (whole or any part of 6 characters or more), key-like runs and
    every other secret :func:`agentlab.core.redact.redact` knows replaced by ``***``."""
    for secret in _secrets_of(model) if model is not None else ():
        text = text.replace(secret, "***")
        for n in range(6, min(len(secret), 40)):  # a masked echo keeps a key's head or tail
            text = text.replace(secret[:n] + "*", "***").replace("*" + secret[-n:], "***")
    return _KEY_LIKE.sub("***", redact(text))


async def probe_model(model, *, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Ask ``model``'s server for its model list (``GET {base_url}/models``) to learn before a run whether
    it answers. Any HTTP answer but 401 / 403 counts as reachable; a model without a base URL (the
    scripted one) passes at once. Sends the model's key in the ``Authorization`` header, as the client
    would, and never prints it.

    Raises:
        ModelUnavailable: the server cannot be reached within ``timeout_s`` seconds (names the URL and
            what to start), or it refused the key (HTTP 401 / 403).
    """
    import httpx

    base = model_base_url(model)
    if base is None:
        return
    url = base.rstrip("/") + "/models"
    secrets = _secrets_of(model)
    headers = {"Authorization": f"Bearer {secrets[0]}"} if secrets else {}
    try:
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            response = await client.get(url, headers=headers)
    except httpx.HTTPError as exc:
        raise ModelUnavailable(f"cannot reach the model server at {safe_url(base)} ({_reason(exc)}); start it "
                               "(ollama serve, vllm serve MODEL, llama-server -m FILE) or fix the base URL") from None
    if response.status_code in (401, 403):
        raise ModelUnavailable(f"the model server at {safe_url(base)} refused the API key (HTTP "
                               f"{response.status_code}); check the key's environment variable")


def _reason(exc: BaseException) -> str:
    import httpx

    if isinstance(exc, httpx.ConnectError):
        return "connection refused or host not found"
    if isinstance(exc, httpx.TimeoutException):
        return "no answer in time"
    return type(exc).__name__


def describe_model_error(exc: BaseException, model=None) -> str | None:
    """One line for an error the model's client raised during a run, with no key in it; None when
    ``exc`` is not a model client's error (the caller describes it as usual)."""
    import sys

    openai = sys.modules.get("openai")  # not imported: the error is not its client's
    if openai is None:
        return None
    base = model_base_url(model) if model is not None else None
    where = f" at {safe_url(base)}" if base else ""
    if isinstance(exc, openai.APIConnectionError):
        return f"the model server{where} could not be reached ({scrub(str(exc), model).rstrip('.')})"
    if isinstance(exc, openai.AuthenticationError | openai.PermissionDeniedError):
        return f"the model server{where} refused the API key (HTTP {exc.status_code})"
    if isinstance(exc, openai.APIStatusError):
        detail = exc.message if isinstance(getattr(exc, "message", None), str) else str(exc)
        return f"the model server{where} answered HTTP {exc.status_code}: {scrub(detail, model)[:300]}"
    if isinstance(exc, openai.OpenAIError):
        return f"the model client failed: {type(exc).__name__}: {scrub(str(exc), model)[:300]}"
    return None


def prompt_for_model(scenario, ids: list[int]) -> str:
    """The scenario's prompt as a real model is sent it: with the ids of the rows the episode created
    (``The customer ids: Acme Analytics = 17.``), which the scripted model knows from its script and a
    real one can only read."""
    rows = getattr(scenario, "customers", ()) or ()
    if not ids:
        return scenario.prompt
    names = [getattr(row, "name", f"row {n + 1}") for n, row in enumerate(rows)] or [f"row {n + 1}" for n in range(len(ids))]
    listed = ", ".join(f"{name} = {i}" for name, i in zip(names, ids))
    return f"{scenario.prompt}\n\nThe customer ids: {listed}."


# --------------------------------------------------------------------------- the command line

def add_model_arguments(parser, *, model: bool = True) -> None:
    """``--model``, ``--base-url`` and ``--api-key-env`` for a command that runs episodes (``demo``, ``chaos``);
    ``model=False`` leaves ``--model`` to a parser that has it already."""
    if model:
        parser.add_argument("--model", metavar="PROVIDER:MODEL", default=None,
                            help="a real chat model instead of the scripted one (the default), e.g. "
                            "openai:gpt-4o-mini, or openai:qwen2.5:7b with --base-url")
    parser.add_argument("--base-url", metavar="URL", default=None,
                        help="an OpenAI-compatible server's /v1 URL: Ollama http://localhost:11434/v1, vLLM "
                        "http://localhost:8000/v1, llama.cpp http://localhost:8080/v1 (no key needed)")
    parser.add_argument("--api-key-env", metavar="VAR", default=None,
                        help="the environment variable holding the model's key (default: OPENAI_API_KEY for a "
                        "hosted openai: model, none with --base-url); a key is never given on the command line")


def model_from_args(args):
    """The real model the options name, checked to answer (:func:`probe_model`), or None for the scripted one.

    Raises:
        ModelUnavailable: ``--base-url`` or ``--api-key-env`` without ``--model``, or what
            :func:`load_model` and :func:`probe_model` raise.
    """
    import asyncio

    name = getattr(args, "model", None)
    if name is None:
        if getattr(args, "base_url", None) or getattr(args, "api_key_env", None):
            raise ModelUnavailable("--base-url and --api-key-env go with --model PROVIDER:MODEL, e.g. "
                                   "--model openai:qwen2.5:7b --base-url http://localhost:11434/v1")
        return None
    model = load_model(name, base_url=args.base_url, api_key_env=args.api_key_env)
    asyncio.run(probe_model(model))
    return model
