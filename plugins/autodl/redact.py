"""Secrets never printed: the one redaction of URLs, environments and free text that autodl shows.

Details: docs/security.md#autodlredact.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

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
            found.update(passwords_in(value))
    return sorted((s for s in found if len(s) >= MIN_KNOWN_SECRET), key=len, reverse=True)


def passwords_in(value: str) -> list[str]:
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
        out: dict[Any, Any] = {}  # the same keys as obj, a JSON-like value each
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


# ---------------------------------------------------------------------------------- the training's report
REPORT_MAX_BYTES = 64 << 10
"""Largest training report autodl reads or stores, bytes of JSON (64 KiB: a report says which checkpoint and epoch
a run resumed from and a few figures; anything larger is refused whole, not cut)."""

REPORT_MAX_DEPTH = 8
"""Deepest nesting of lists and objects kept in a training report."""

REPORT_MAX_ITEMS = 1_000
"""Entries (keys and list items, all levels together) kept in a training report."""

REPORT_MAX_STRING = 4_096
"""Characters kept of one string (or key) in a training report; the rest is replaced by ``...``."""

SECRET_VALUE = re.compile(
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----(?:[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----|[\s\S]*)|"
    r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}|"
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b|\bgh[pousr]_[A-Za-z0-9]{30,}\b|\bxox[abprs]-[A-Za-z0-9-]{10,}|"
    r"\bsk-[A-Za-z0-9_-]{20,}\b|\bgAAAAA[A-Za-z0-9_=-]{40,}")
"""Values that are secrets whatever their key: a PEM private key (to its end line, else to the end of the string),
a JWT, AWS access key ids, GitHub, Slack and OpenAI-style tokens (their documented prefixes) and Fernet tokens (``gAAAAA``: a version byte 0x80 in base64)."""


class TrainingReport(BaseModel):
    """A training's report, as autodl stores it: bounded, JSON-only, secrets hidden.

    :ivar data: the report's object (str keys; str, finite number, bool, null, list, object values).
    :ivar redacted: how many keys or values were hidden (``***``).
    :ivar dropped: entries left out (too deep, too many, or not JSON), and strings cut.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    data: dict[str, Any] = Field(default_factory=dict)
    redacted: int = 0
    dropped: int = 0


class _Budget:
    def __init__(self, secrets: list[str]):
        self.items, self.redacted, self.dropped, self.secrets = REPORT_MAX_ITEMS, 0, 0, secrets

    def text(self, value: str) -> str:
        if len(value) > REPORT_MAX_STRING:
            value, self.dropped = value[:REPORT_MAX_STRING] + "...", self.dropped + 1
        clean = SECRET_VALUE.sub(MASK, value)
        for secret in self.secrets:
            clean = clean.replace(secret, MASK)
        clean = redact_text(clean, {})
        if clean != value:
            self.redacted += 1
        return clean


def _clean(value: Any, budget: _Budget, depth: int) -> Any:
    """``value`` as stored (see :func:`sanitize_report`); ``_DROP`` for what is left out."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if abs(value) < 1 << 63 else _DROP
    if isinstance(value, float):
        return value if math.isfinite(value) else _DROP
    if isinstance(value, str):
        return budget.text(value)
    if depth >= REPORT_MAX_DEPTH or not isinstance(value, (list, tuple, Mapping)):
        return _DROP
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            budget.items -= 1
            if budget.items < 0 or not isinstance(key, str):
                budget.dropped += 1
                continue
            name = budget.text(key)
            if is_secret_name(key) and item not in (None, "", False):
                out[name], budget.redacted = MASK, budget.redacted + 1
                continue
            clean = _clean(item, budget, depth + 1)
            if clean is _DROP:
                budget.dropped += 1
            else:
                out[name] = clean
        return out
    items = []
    for item in value:
        budget.items -= 1
        clean = _clean(item, budget, depth + 1) if budget.items >= 0 else _DROP
        if clean is _DROP:
            budget.dropped += 1
        else:
            items.append(clean)
    return items


_DROP = object()


def sanitize_report(obj: Any, environ: Mapping[str, str] | None = None) -> TrainingReport:
    """What a training wrote about itself, made fit to store and show; the one function every path that stores a
    training report calls (the report file, a log-stream transport, the record store).

    Nothing of it is trusted: ``obj`` (bytes or text of JSON, or an already parsed object) must be a JSON object of
    at most :data:`REPORT_MAX_BYTES`; it keeps at most :data:`REPORT_MAX_DEPTH` levels, :data:`REPORT_MAX_ITEMS`
    entries and :data:`REPORT_MAX_STRING` characters per string; values of secret-named keys, secret-looking values
    (:data:`SECRET_VALUE`, URLs with passwords, ``NAME=value``) and every value this worker knows to be secret
    (:func:`known_secrets` of ``environ``, default this process's environment: what a training that read its
    ancestors' ``/proc/<pid>/environ`` would hand back) become ``***``.

    :raises ValueError: when ``obj`` is too large, not JSON, or not a JSON object (the message says which).
    """
    if isinstance(obj, (bytes, bytearray, str)):
        if len(obj) > REPORT_MAX_BYTES:
            raise ValueError(f"the training's report is {len(obj)} bytes, more than {REPORT_MAX_BYTES}: refused whole")
        try:
            obj = json.loads(obj, parse_constant=lambda c: None)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"the training's report is not JSON ({str(exc)[:200]})") from None
    if not isinstance(obj, Mapping):
        raise ValueError(f"the training's report must be a JSON object, not {type(obj).__name__}")
    budget = _Budget(known_secrets(environ))
    data = _clean(obj, budget, 0)
    size = len(json.dumps(data))
    if size > REPORT_MAX_BYTES:
        raise ValueError(f"the training's report is {size} bytes of JSON, more than {REPORT_MAX_BYTES}: refused whole")
    return TrainingReport(data=data, redacted=budget.redacted, dropped=budget.dropped)


__all__ = ["MASK", "REPORT_MAX_BYTES", "TrainingReport", "is_secret_name", "known_secrets", "redact_env",
           "redact_obj", "redact_text", "redact_url", "sanitize_report"]
