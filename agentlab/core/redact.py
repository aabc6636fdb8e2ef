"""Redaction: passwords, keys, tokens and card numbers out of every text the kit logs, stores or prints."""

from __future__ import annotations

import re

SECRET_PATTERNS = (
    # postgresql://user:password@host, up to the token's last @ (a password may hold an unencoded @)
    (re.compile(r"(://[^:/@\s]*:)\S+@"), r"\1***@"),
    # key=value conninfo: a quoted value up to its closing quote, else up to the first space that no
    # backslash escapes (libpq's rules: 'it\'s', s3cr3t\ x), so no part of the password is left
    (re.compile(r"(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'?|(?:[^\s\\]|\\.)+)"), r"\1***"),
    (re.compile(r"(?i)\b((?:secret|token|api[_-]?key|access[_-]?key|secret[_-]?access[_-]?key|[a-z_]*_secret)"
                r"[a-z_]*\s*[=:]\s*)('[^']*'|\"[^\"]*\"|\S+)"), r"\1***"),
    (re.compile(r"\b(sk|rk|pk)_(live|test)_[A-Za-z0-9]+"), r"\1_\2_***"),  # payment provider keys
    (re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]+"), "Bearer ***"),
    (re.compile(r"\b(?:\d[ -]?){12,18}\d\b"), "****CARD****"),  # card-number-like digit runs
)


def redact(text: str) -> str:
    """Return ``text`` with passwords, keys, tokens and card numbers replaced by ``***``.

    Used on everything the kit logs or stores as error detail: a DSN's password (URL or key=value
    form), ``secret=`` / ``token=`` / ``api_key=`` values, ``sk_live_...`` keys, bearer tokens and
    card-number-like runs of 13 to 19 digits.
    """
    for pattern, replacement in SECRET_PATTERNS:
        text = pattern.sub(replacement, text)
    return text
