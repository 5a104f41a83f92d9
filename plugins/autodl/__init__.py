"""autodl: profile a PaddlePaddle training script, place it on a device, launch, measure, record.

The core (everything outside ``operators/``, ``triggers/``, ``plugin.py``, ``listeners.py``, ``policies.py``)
imports no Airflow and is testable with plain pytest. Installed as the distribution
:data:`DISTRIBUTION`; the import name stays ``autodl``.
"""

__version__ = "0.1.0"
"""The one version source: ``pyproject.toml`` reads it (setuptools ``dynamic``), the provider info reports it."""

DISTRIBUTION = "airflow-provider-autodl"
"""The name on the package index (the Airflow ecosystem's ``airflow-provider-<name>`` convention; the bare
``autodl`` there is an unrelated package): what ``pip install`` and autodl's messages name."""


def pip_install(extras: str = "") -> str:
    """The install command for this distribution with ``extras`` (comma-separated, e.g. ``"docker"``)."""
    return f'pip install "{DISTRIBUTION}[{extras}]"' if extras else f"pip install {DISTRIBUTION}"
