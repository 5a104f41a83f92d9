"""autodl's own metrics for Prometheus (``prometheus-client``): leases held, waiting runs, estimate error, run outcomes.

Details: docs/reference/cli.md#autodlexposition.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

ESTIMATE_WINDOW = 200
"""Records the estimate error is computed over (newest first)."""

WAIT_BUCKETS_S = (30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 43200.0, 86400.0)
"""Upper bounds (s) of the admission wait histogram's buckets (then +Inf): from one poll of a waiting run
(a spec's default ``scheduler.poke_interval``, 30 s) through its default ``scheduler.timeout`` (3600 s) to a
day, roughly doubling (autodl's choice; a wait past a day lands in +Inf)."""


def _utc(at: datetime) -> datetime:
    return at if at.tzinfo else at.replace(tzinfo=timezone.utc)


class AutoDLCollector(Collector):
    """Reads the ledger, the run records, the run state and the admission queue on every scrape.

    :param store_url: autodl's store; default :func:`autodl.config.store_url`.
    """

    def __init__(self, store_url: str | None = None):
        self.store_url = store_url

    def collect(self) -> Iterator[Metric]:
        from autodl.ledger import Ledger
        from autodl.records import RecordStore

        leases = Ledger(self.store_url).leases()
        held = GaugeMetricFamily("autodl_leases_held", "Live leases in autodl's ledger.")
        held.add_metric([], len(leases))
        yield held
        devices = GaugeMetricFamily("autodl_leased_devices", "Devices booked by live leases.", labels=["host", "model"])
        counts: dict[tuple[str, str], int] = {}
        for lease in leases:
            key = (lease.host, lease.model or "unknown")
            counts[key] = counts.get(key, 0) + len(lease.device_ids)
        for (host, model), n in sorted(counts.items()):
            devices.add_metric([host, model], n)
        yield devices

        records = RecordStore(self.store_url).list(limit=100_000)
        outcomes = CounterMetricFamily("autodl_runs", "Recorded runs by outcome.", labels=["outcome"])
        by_outcome: dict[str, int] = {"succeeded": 0, "failed": 0, "not_started": 0, "stopped": 0}
        ooms = 0
        for r in records:
            by_outcome[r.outcome] = by_outcome.get(r.outcome, 0) + 1
            ooms += 1 if r.oom else 0
        for outcome, n in sorted(by_outcome.items()):
            outcomes.add_metric([outcome], n)
        yield outcomes
        oom = CounterMetricFamily("autodl_runs_oom", "Recorded runs that ended with an out-of-memory error.")
        oom.add_metric([], ooms)
        yield oom

        ratios: dict[str, list[float]] = {}
        for r in records[:ESTIMATE_WINDOW]:
            if r.estimated_peak_bytes and r.actual_peak_bytes and not r.declared_pool:
                ratios.setdefault(r.device_model or "unknown", []).append(r.estimated_peak_bytes / r.actual_peak_bytes)
        error = GaugeMetricFamily("autodl_estimate_error_ratio",
                                  "Mean estimated / actual peak memory of recent runs on real devices.", labels=["device_model"])
        n_records = GaugeMetricFamily("autodl_estimate_error_records",
                                      "Records the estimate error ratio is computed over.", labels=["device_model"])
        for model, values in sorted(ratios.items()):
            error.add_metric([model], sum(values) / len(values))
            n_records.add_metric([model], len(values))
        yield error
        yield n_records

        yield from self._queue_metrics()

        waiting = GaugeMetricFamily("autodl_waiting_runs", "Runs profiled but not booked yet (waiting for the pool).")
        recorded = {r.run_key: r.recorded_at for r in records}
        waiting.add_metric([], len(self.waiting({le.run_key for le in leases}, recorded)))
        yield waiting

    def _queue_metrics(self) -> Iterator[Metric]:
        """The admission wait histogram per team and the held queues."""
        from autodl.admissions import Admissions
        from autodl.queue_hold import QueueHolds
        from autodl.quota import NO_TEAM

        waits = HistogramMetricFamily("autodl_admission_wait_seconds",
                                      "Seconds admitted runs waited in autodl's admission queue, by team.", labels=["team"])
        by_team: dict[str, list[float]] = {}
        for team, waited in Admissions(self.store_url).wait_times():
            by_team.setdefault(team or NO_TEAM, []).append(waited)
        for team, values in sorted(by_team.items()):
            buckets = [(_bound(b), sum(1 for v in values if v <= b)) for b in WAIT_BUCKETS_S]
            waits.add_metric([team], buckets + [("+Inf", len(values))], sum(values))
        yield waits
        held = GaugeMetricFamily("autodl_queue_held", "1 for each held queue (team '*': the whole queue).", labels=["team"])
        for h in QueueHolds(self.store_url).holds():
            held.add_metric([h.team], 1)
        yield held

    def waiting(self, leased: set[str], recorded: dict[str, datetime]) -> set[str]:
        """Run keys profiled (run state) or queued (admission queue) that hold no live lease and were not recorded
        since (``recorded``: run key -> when its record was written)."""
        from autodl.queue import AdmissionQueue
        from autodl.store import RunState

        since = RunState(self.store_url).written(RunState.PROFILE)
        for entry in AdmissionQueue(self.store_url).entries():
            since[entry.run_key] = max(since.get(entry.run_key, entry.enqueued_at), entry.enqueued_at)
        return {key for key, at in since.items()
                if key not in leased and (key not in recorded or _utc(recorded[key]) < at)}


def _bound(seconds: float) -> str:
    """A bucket bound as Prometheus writes it (``30.0``)."""
    return repr(float(seconds))


def registry(store_url: str | None = None) -> CollectorRegistry:
    """A registry holding only :class:`AutoDLCollector` (no process or platform collectors)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(AutoDLCollector(store_url))
    return reg


def serve(port: int, *, addr: str = "127.0.0.1", store_url: str | None = None) -> Any:
    """Serve ``/metrics`` on ``addr:port`` in a background thread (``prometheus_client.start_http_server``).

    :returns: ``(server, thread)``; ``server.shutdown()`` stops it.
    :raises AutoDLError: when ``addr:port`` cannot be served (port in use or out of range, an address this host
        does not have), naming them.
    """
    from prometheus_client import start_http_server

    from autodl.errors import AutoDLError

    if not 0 <= int(port) <= 65535:
        raise AutoDLError(f"exporter port {port}: a TCP port is 0-65535 (--port)")
    try:
        return start_http_server(port, addr=addr, registry=registry(store_url))
    except (OSError, UnicodeError) as exc:  # UnicodeError: a host name IDNA cannot encode (a label over 63 characters)
        from autodl.errors import ConfigError  # exit 10: the address is the user's choice, not a bug (exit 1)

        raise ConfigError(f"cannot serve autodl's metrics on {str(addr)[:120]}:{port}: {getattr(exc, 'strerror', None) or exc}; "
                          "choose a free --port, or a --host address of this machine") from None
