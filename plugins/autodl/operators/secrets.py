"""autodl's own secrets (the store URL's password, pool URL passwords) registered with Airflow's secrets masker.

Inside Airflow a task's log, its rendered template fields and its XComs pass through Airflow's masker,
which hides only what it was told about. autodl's store URL and a ``prometheus+http://user:pw@...`` pool
come from autodl's own settings (``AUTODL_STORE_URL``, ``[autodl] store_url``, ``AUTODL_POOL``, an
operator's ``gpu_pool``), not from an Airflow connection, so the masker would not know them. Outside
Airflow the CLI keeps its own redaction (:mod:`autodl.redact`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from autodl.redact import MIN_KNOWN_SECRET, passwords_in


def _mask_secret() -> Callable[[str], None]:
    """Airflow's ``mask_secret``: ``airflow.sdk.log`` (Task SDK), else the older
    ``airflow.sdk.execution_time.secrets_masker``."""
    try:
        from airflow.sdk.log import mask_secret
    except ImportError:
        from airflow.sdk.execution_time.secrets_masker import mask_secret as older_mask_secret

        return older_mask_secret
    return mask_secret


def autodl_secrets(urls: Iterable[str | None] = ()) -> list[str]:
    """The passwords (and the pieces a driver may quote) inside autodl's store URL, its default inventory
    source and ``urls``; secrets shorter than :data:`autodl.redact.MIN_KNOWN_SECRET` characters are left out,
    as :func:`autodl.redact.known_secrets` does (masking ``ab`` everywhere would garble every log)."""
    from autodl.config import pool_source, store_url

    found: set[str] = set()
    for url in (store_url(), pool_source(), *urls):
        if url:
            found.update(passwords_in(str(url)))
    return sorted((s for s in found if len(s) >= MIN_KNOWN_SECRET), key=len, reverse=True)


def register_secrets(urls: Iterable[str | None] = ()) -> list[str]:
    """Tell Airflow's secrets masker about :func:`autodl_secrets`; called at the start of every autodl task.

    :param urls: more URLs of this task (its rendered ``gpu_pool``).
    :returns: the values registered (for tests; never log them).
    """
    secrets = autodl_secrets(urls)
    if secrets:
        mask = _mask_secret()
        for secret in secrets:
            mask(secret)
    return secrets
