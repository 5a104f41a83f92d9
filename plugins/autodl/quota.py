"""Team queues from configuration: each team's nominal quota per GPU type, its fair-sharing weight, and priority classes.

Details: docs/team-queues.md#autodlquota.
"""

from __future__ import annotations

import math
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from autodl.errors import ConfigError

ANY_TEAM = "*"
"""The ``teams`` entry that applies to every team not listed by name."""

NO_TEAM = "(no team)"
"""The team of a run that names none and has no owner."""


class TeamQuota(BaseModel):
    """One team's share of the pool (a Kueue ClusterQueue).

    :ivar weight: fair-sharing weight: a team of weight 2 is entitled to twice the borrowed devices of a team
        of weight 1 when both want more than their nominal quota.
    :ivar nominal_quota: devices per device type (model name) the team is guaranteed when it asks; a type not
        listed: 0 (the team may still borrow idle devices of it).
    :ivar borrowing_limit: per device type, how many devices above its nominal quota the team may hold; a type
        not listed (or no limit at all): as many as are idle and owed to no other team.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = ""
    weight: float = Field(1.0, gt=0, description="Fair-sharing weight (> 0).")
    nominal_quota: dict[str, int] = Field(default_factory=dict)
    borrowing_limit: dict[str, int] | None = None

    @field_validator("weight")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("a weight is a finite number > 0, e.g. 1 or 2")
        return value

    @field_validator("nominal_quota", "borrowing_limit")
    @classmethod
    def _counts(cls, value: dict[str, int] | None) -> dict[str, int] | None:
        for kind, n in (value or {}).items():
            if not str(kind).strip():
                raise ValueError("a device type is the inventory's model name, e.g. A100-SXM4-80GB")
            if isinstance(n, bool) or n < 0:
                raise ValueError(f"{kind}: a number of devices >= 0")
        return value

    def nominal(self, device_type: str) -> int:
        """Devices of ``device_type`` guaranteed to the team."""
        return int(self.nominal_quota.get(device_type, 0))

    def may_borrow(self, device_type: str) -> float:
        """Devices of ``device_type`` the team may hold above its nominal quota (inf: no limit)."""
        if self.borrowing_limit is None or device_type not in self.borrowing_limit:
            return math.inf
        return float(self.borrowing_limit[device_type])


class TeamQueues(BaseModel):
    """The team queues of the pool: teams by name and the priority classes.

    :ivar source: the file they were read from, for messages.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    teams: dict[str, TeamQuota] = Field(default_factory=dict)
    priority_classes: dict[str, int] = Field(default_factory=dict)
    source: str | None = None

    def quota(self, team: str | None) -> TeamQuota:
        """The quota of ``team``: its own entry, else the ``"*"`` entry, else no nominal quota at weight 1."""
        name = team or NO_TEAM
        own = self.teams.get(name) or self.teams.get(ANY_TEAM)
        return (own or TeamQuota(name=name, weight=1.0)).model_copy(update={"name": name})

    def priority(self, value: int | str | None, *, field: str = "scheduler.priority") -> int:
        """The priority value of ``value``: an integer as is, a class name from ``priority_classes``; None: 0.

        :raises ConfigError: a class name the configuration does not define, naming the known ones.
        """
        if value is None:
            return 0
        if isinstance(value, int):
            return value
        if value in self.priority_classes:
            return int(self.priority_classes[value])
        known = ", ".join(sorted(self.priority_classes)) or "none defined"
        raise ConfigError(f"{field}: priority class {value!r} is not defined in the team queues "
                          f"({self.source or 'no [autodl] team_queues file'}; classes: {known}); use one of them "
                          "or an integer (higher goes first).")


def team_of(explicit: str | None, owner: str | None) -> str:
    """The team a run counts against: the spec's ``scheduler.team`` when set, else its owner (the user who
    triggered the DAG run, else the DAG's owner), else :data:`NO_TEAM`."""
    return (explicit or owner or NO_TEAM).strip() or NO_TEAM


def parse_team_queues(data: object, source: str) -> TeamQueues:
    """Team queues from parsed YAML.

    :raises ConfigError: naming the file, the field and the fix.
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: team queues are a mapping with 'teams' and 'priority_classes'.")
    teams = data.get("teams") or {}
    if not isinstance(teams, dict):
        raise ConfigError(f"{source}: teams: a mapping of team name to its quota, e.g. vision: {{nominal_quota: {{A100-SXM4-80GB: 4}}}}")
    parsed = {}
    for name, spec in teams.items():
        if spec is not None and not isinstance(spec, dict):
            raise ConfigError(f"{source}: teams.{name}: a mapping of weight, nominal_quota, borrowing_limit; see "
                              "docs/team-queues.md for the format.")
        try:
            parsed[str(name)] = TeamQuota.model_validate({**(spec or {}), "name": str(name)})
        except ValidationError as exc:
            raise ConfigError(f"{source}: teams.{name}.{_first_error(exc)}; see docs/team-queues.md for the format.") from None
    try:
        return TeamQueues(teams=parsed, priority_classes=data.get("priority_classes") or {}, source=source)
    except ValidationError as exc:
        raise ConfigError(f"{source}: priority_classes.{_first_error(exc)} (a class is a name and an integer); see "
                          "docs/team-queues.md for the format.") from None


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"] if p != "priority_classes")
    return f"{loc}: {err['msg']}"


def load_team_queues(path: str | Path | None = None) -> TeamQueues:
    """The team queues named by ``[autodl] team_queues`` / ``AUTODL_TEAM_QUEUES`` (or ``path``); no teams when unset.

    :raises ConfigError: the file is missing or malformed, naming it and the field.
    """
    from autodl.config import read_yaml, setting

    where = str(path) if path else setting("team_queues")
    if not where:
        return TeamQueues()
    data = read_yaml(where, ConfigError, "the team queues file ([autodl] team_queues / AUTODL_TEAM_QUEUES) does not exist")
    return parse_team_queues(data, where)


__all__ = ["ANY_TEAM", "NO_TEAM", "TeamQuota", "TeamQueues", "load_team_queues", "parse_team_queues", "team_of"]
