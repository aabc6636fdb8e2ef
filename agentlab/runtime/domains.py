"""Finding a domain by name: ``billing`` (the default), ``retail`` once shipped, or ``package.module:NAME``."""

from __future__ import annotations

import importlib
import os
import sys

from agentlab.core.domain import Domain
from agentlab.core.errors import DomainError

BUILTIN = {"billing": "agentlab.domains.billing:DOMAIN", "retail": "agentlab.domains.retail:DOMAIN"}


def resolve_domain(spec: str | Domain | None = None) -> Domain:
    """The domain ``spec`` names: a :class:`Domain` itself, None (billing), a built-in name, or
    ``package.module:NAME`` (a module importable from the current directory or ``sys.path``).

    Raises:
        DomainError: the module cannot be imported, has no such name, or the name is not a Domain.
    """
    if isinstance(spec, Domain):
        return spec
    ref = BUILTIN.get(spec or "billing", spec or "billing")
    if ":" not in ref:
        raise DomainError(f"unknown domain {spec!r}: use one of {', '.join(BUILTIN)} or package.module:NAME")
    module_name, _, attr = ref.partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # python -m agentlab chaos --domain examples.x:DOMAIN from the repo
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise DomainError(f"cannot import the domain module {module_name!r}: {exc}") from exc
    value = getattr(module, attr, None)
    if not isinstance(value, Domain):
        raise DomainError(f"{ref!r} is not a Domain (module {module_name!r} has "
                          f"{'no name ' + repr(attr) if value is None else type(value).__name__ + ' there'})")
    return value


def domain_reference(domain: Domain) -> str | None:
    """A name another process can give :func:`resolve_domain` to get ``domain`` back (a built-in name, or
    ``package.module:NAME`` of the module that defines its ``create_rows`` and holds it), or None for a
    domain it cannot import (made in a notebook, or changed with ``dataclasses.replace``). The failure lab
    runs a domain's episodes in several processes only when it has one."""
    if BUILTIN.get(domain.name) and _resolves(domain.name, domain):
        return domain.name
    module_name = getattr(domain.create_rows, "__module__", None)
    module = sys.modules.get(module_name or "")
    if module is None or module_name == "__main__":
        return None
    for attr, value in vars(module).items():
        if value is domain and _resolves(f"{module_name}:{attr}", domain):
            return f"{module_name}:{attr}"
    return None


def _resolves(ref: str, domain: Domain) -> bool:
    try:
        return resolve_domain(ref) is domain
    except DomainError:
        return False
