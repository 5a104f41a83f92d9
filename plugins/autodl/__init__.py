"""autodl: profile a PaddlePaddle training script, place it on a device, launch, measure, record.

The core (everything outside ``operators/``, ``sensors/``, ``triggers/``, ``plugin.py``) imports no
Airflow and is testable with plain pytest.
"""

__version__ = "0.1.0"
