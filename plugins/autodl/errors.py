"""One exception hierarchy for autodl, each error a message a person can act on."""

from __future__ import annotations


class AutoDLError(Exception):
    """Base of every error autodl raises on purpose.

    The message names the input (file, field, line), what was wrong and what to do.
    ``exit_code`` is what the ``autodl`` CLI exits with.
    """

    exit_code = 1


class SpecError(AutoDLError):
    """The task spec (YAML) is missing, unreadable or invalid."""

    exit_code = 2


class ProfileError(AutoDLError):
    """The training script cannot be profiled (missing file, syntax error, shape error)."""

    exit_code = 3


class NoFitError(AutoDLError):
    """Nothing in the whole pool can ever hold the run; carries the advice as ``suggestions``."""

    exit_code = 4

    def __init__(self, message: str, suggestions: list[str] | None = None):
        super().__init__(message)
        self.suggestions = list(suggestions or [])


class InventoryError(AutoDLError):
    """The device inventory could not be read (bad pool file, NVML failure)."""

    exit_code = 5


class LeaseError(AutoDLError):
    """A lease could not be booked or released."""

    exit_code = 6


class PoolBusy(LeaseError):
    """Fitting devices exist but none is granted to this run now: keep waiting (never a failure)."""


class LeaseLost(LeaseError):
    """The run's lease expired (no heartbeat within its TTL) or was released by someone else."""


class WaitTimeout(LeaseError):
    """No fitting device was granted within the spec's ``scheduler.timeout``."""


class NotOwner(LeaseError):
    """Releasing a lease booked by someone else without ``--force``."""


class LaunchError(AutoDLError):
    """The training could not be started, followed or stopped."""

    exit_code = 7


class TrainingFailed(LaunchError):
    """The training ended badly (non-zero exit) or was stopped for a reason a retry cannot mend (its lease
    lost, a time limit, an unschedulable pod): following it again would see the same end."""


class CatalogError(AutoDLError):
    """The GPU catalog is invalid or lacks a device model."""

    exit_code = 8


class StoreError(AutoDLError):
    """autodl's own store (AUTODL_STORE_URL) cannot be reached or used."""

    exit_code = 9


class StoreUnavailable(StoreError):
    """The store did not answer for a while (server restarting, connection lost): worth retrying."""


class ConfigError(AutoDLError):
    """A setting (``AUTODL_*`` variable or Airflow's ``[autodl]`` section) is invalid, or autodl's shipped files are missing."""

    exit_code = 10


class StateError(StoreError):
    """A value one step handed the next (an XCom, a trigger's kwargs, a run-state row) is not what the
    reading step expects: a field missing or renamed (another autodl version, or edited by hand)."""

    exit_code = 9
