"""Secrets never printed: the one redaction of URLs, environments and free text that autodl shows.

Used wherever a URL or an environment can reach a message, a log line, a finding, a record or ``--json``:

* :func:`redact_url` — a URL (or a scheme-less ``user:pw@host/db``) with its password or token replaced by
  ``***``. The password may hold any character, a raw ``@`` included: as SQLAlchemy parses it, the
  userinfo runs to the *last* ``@``, so everything up to it is hidden. Query parameters named like a
  secret (``?password=``, ``?pass=``, ``?sslpassword=``, ``?token=``, ...) are hidden too.
* :func:`redact_env` — an environment with the values of secret-named variables (``*PASSWORD*``,
  ``*SECRET*``, ``*TOKEN*``, ``*KEY*``, ...) hidden and connection strings (``AUTODL_STORE_URL``,
  ``AIRFLOW__*``, ``AIRFLOW_CONN_*``, any URL) shown without their password.
* :func:`redact_text` — free text (an exception message, a child's stderr): every URL in it, every
  ``NAME=value`` of a secret-named variable, and every value this process knows to be secret (the store
  URL's password, the values of its own secret-named variables) wherever it appears, e.g. echoed by a
  script that read ``/proc/<pid>/environ``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

MASK = "***"

SECRET_NAME = re.compile(r"PASSWORD|PASSWD|PASSPHRASE|SECRET|TOKEN|KEY|CREDENTIAL|PRIVATE|AUTH|COOKIE|SESSION|PWD$",
                         re.IGNORECASE)
"""Variable (and query parameter) names whose values are secrets."""

NOT_SECRET = frozenset({"AUTODL_RUN_KEY", "RUN_KEY", "RUN_KEY_HASH", "PWD", "OLDPWD", "KEYTIMEOUT"})
"""Names that match :data:`SECRET_NAME` but hold nothing secret (``PWD`` is the working folder; ``run_key`` is the
label ``autodl.run_key=...`` of a container, which a ``docker run`` line shown by ``autodl plan`` must keep)."""

CONNECTION_VARS = re.compile(r"^(AUTODL_STORE_URL|AIRFLOW__.*|AIRFLOW_CONN_.*|.*_(URL|URI|DSN|CONN))$", re.IGNORECASE)
"""Variables that hold connection strings: shown as URLs without their password."""

_QUERY_SECRET = re.compile(
    r"(?P<lead>[?&;](?:[\w.-]*(?:password|passwd|pass|pwd|secret|token|key|credential|auth|signature|sig)[\w.-]*)=)"
    r"(?P<value>[^&;#\s]*)",
    re.IGNORECASE,
)
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,40}://")
_SCHEMELESS = re.compile(
    r"(?<![\w/:@*])(?P<user>[A-Za-z0-9._%+-]{1,128}):(?!//)(?P<pw>\S+)@(?P<host>[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])"
    r"(?P<tail>(?::\d+)?(?:/|\s|$|[,;)'\"]))"
)
_ASSIGN = re.compile(r"(?P<name>\b[A-Za-z_][A-Za-z0-9_]*)=(?:\"(?P<dq>[^\"]*)\"|'(?P<sq>[^']*)'|(?P<value>[^\s'\",;&]+))")

MIN_KNOWN_SECRET = 8
"""Known secret values shorter than this are not searched for in free text: a short password (``autodl``) is a
common word there; URLs and ``NAME=value`` still hide it by position."""


def is_secret_name(name: str) -> bool:
    """True when an environment variable or parameter called ``name`` holds a secret."""
    return name.upper() not in NOT_SECRET and bool(SECRET_NAME.search(name))


def _redact_token(token: str) -> str:
    """One whitespace-free token starting with ``scheme://``."""
    match = _SCHEME.match(token)
    if not match:
        return token
    scheme, rest = match.group(0), token[match.end():]
    at = rest.rfind("@")  # the userinfo runs to the last '@' (SQLAlchemy's and urllib's reading)
    if at >= 0:
        userinfo, rest = rest[:at], rest[at:]
        user, colon, _password = userinfo.partition(":")
        if colon:
            userinfo = f"{user}:{MASK}"
        elif any(c in userinfo for c in "/?#"):  # the '@' is in the path or query: there is no userinfo
            return scheme + _QUERY_SECRET.sub(lambda m: m.group("lead") + MASK, userinfo + rest)
        else:  # a bare token as the user (https://TOKEN@host)
            userinfo = MASK if userinfo else userinfo
        rest = "@" + _QUERY_SECRET.sub(lambda m: m.group("lead") + MASK, rest[1:])
        return scheme + userinfo + rest
    return scheme + _QUERY_SECRET.sub(lambda m: m.group("lead") + MASK, rest)


def redact_url(url: str) -> str:
    """``url`` with its password (or userinfo token) and secret query parameters replaced by ``***``.

    ``postgresql+psycopg2://autodl:p@ss:w/rd@db:5432/autodl?sslpassword=x`` becomes
    ``postgresql+psycopg2://autodl:***@db:5432/autodl?sslpassword=***``; ``user:pw@host/db`` becomes
    ``user:***@host/db``.
    """
    return redact_text(url)


def _redact_urls(text: str) -> str:
    out: list[str] = []
    pos = 0
    for match in _SCHEME.finditer(text):
        start = match.start()
        if start < pos:
            continue
        end = start
        while end < len(text) and not text[end].isspace():
            end += 1
        out.append(text[pos:start])
        out.append(_redact_token(text[start:end]))
        pos = end
    out.append(text[pos:])
    text = "".join(out)
    text = _SCHEMELESS.sub(lambda m: f"{m.group('user')}:{MASK}@{m.group('host')}{m.group('tail')}", text)
    return text


def known_secrets(environ: Mapping[str, str] | None = None) -> list[str]:
    """Values this process holds that must never be printed: secret-named variables' values and the
    passwords inside connection strings (``AUTODL_STORE_URL``, ``AIRFLOW__*``, ``AIRFLOW_CONN_*``), longest first."""
    env = os.environ if environ is None else environ
    found: set[str] = set()
    for name, value in env.items():
        if not value:
            continue
        if is_secret_name(name):
            found.add(value)
        if CONNECTION_VARS.match(name) or _SCHEME.match(value):
            found.update(_passwords_in(value))
    return sorted((s for s in found if len(s) >= MIN_KNOWN_SECRET), key=len, reverse=True)


def _passwords_in(value: str) -> list[str]:
    """The secrets inside a connection string, and the pieces of each a driver may quote on its own.

    The password is taken as autodl's redaction reads a URL (the userinfo runs to the last ``@``), also when it holds
    a space or a ``/`` (``user:pw SECRET/x@host``: a variable holds one URL, so it is not split at whitespace).
    A driver may read such a URL differently and quote only a part of the password in its error (psycopg2 took
    ``p@ss-SECRET@1@host``'s host to be ``ss-SECRET@1@host``), so the pieces around each ``@``, ``/`` or space
    are secrets too."""
    out = []
    for match in _SCHEME.finditer(value):
        candidates = [value[match.end():]]
        first = candidates[0].split()[0] if candidates[0].strip() else ""
        if first != candidates[0]:
            candidates.append(first)
        for rest in candidates:
            at = rest.rfind("@")
            if at >= 0:
                user, colon, password = rest[:at].partition(":")
                secret = password if colon else user
                out.append(secret)
                for sep in ("@", "/", " "):
                    pieces = secret.split(sep)
                    for i in range(1, len(pieces)):
                        out.append(sep.join(pieces[:i]))
                        out.append(sep.join(pieces[i:]))
            for q in _QUERY_SECRET.finditer(rest):
                out.append(q.group("value"))
    if not _SCHEME.match(value):  # scheme-less user:pw@host/db
        m = _SCHEMELESS.search(value)
        if m:
            out.append(m.group("pw"))
    return [p for p in out if p]


def redact_text(text: Any, environ: Mapping[str, str] | None = None) -> str:
    """``text`` with every URL's password, every secret ``NAME=value`` and every known secret value hidden."""
    text = str(text)
    if not text:
        return text
    for secret in known_secrets(environ):
        if secret in text:
            text = text.replace(secret, MASK)
    text = _redact_urls(text)

    def assign(m: re.Match) -> str:
        if not is_secret_name(m.group("name")):
            return m.group(0)
        quote = '"' if m.group("dq") is not None else "'" if m.group("sq") is not None else ""
        return f"{m.group('name')}={quote}{MASK}{quote}"

    return _ASSIGN.sub(assign, text)


def redact_env(env: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``env`` fit to print: secret-named values ``***``, connection strings without passwords."""
    out: dict[str, Any] = {}
    for name, value in env.items():
        if value is None or value == "":
            out[name] = value
        elif is_secret_name(str(name)):
            out[name] = MASK
        else:
            out[name] = redact_text(value) if isinstance(value, str) else value
    return out


def redact_obj(obj: Any, _depth: int = 0) -> Any:
    """``obj`` (JSON-like: dicts, lists, strings) with :func:`redact_env` applied to every ``env`` mapping and
    :func:`redact_text` to every string; for rendered launches (``autodl plan --json``) and records."""
    if _depth > 32:
        return obj
    if isinstance(obj, Mapping):
        out = {}
        secret_entry = isinstance(obj.get("name"), str) and is_secret_name(obj["name"]) and "value" in obj
        for key, value in obj.items():
            if key in ("env", "environment") and isinstance(value, Mapping):
                out[key] = redact_env(value)
            elif secret_entry and key == "value" and value:  # a Kubernetes EnvVar {name, value}
                out[key] = MASK
            else:
                out[key] = redact_obj(value, _depth + 1)
        return out
    if isinstance(obj, (list, tuple)):
        return [redact_obj(v, _depth + 1) for v in obj]
    if isinstance(obj, str):
        return redact_text(obj)
    return obj


__all__ = ["MASK", "is_secret_name", "known_secrets", "redact_env", "redact_obj", "redact_text", "redact_url"]
