"""autodl.registry: the launchers and inventory sources are declared once, by name, and validated against."""

import pytest

from autodl import registry
from autodl.errors import SpecError
from autodl.spec import parse_spec


def test_every_launcher_entry_names_a_launcher_class():
    for name, target in registry.LAUNCHERS.items():
        launcher = registry.load(target)
        assert isinstance(launcher, type) and launcher.name == name
        assert all(callable(getattr(launcher, method, None)) for method in ("launch", "poll", "read_logs", "stop",
                                                                             "render")), name


@pytest.mark.parametrize("entries", [registry.INVENTORY_SOURCES, registry.INVENTORY_SCHEMES])
def test_every_inventory_entry_names_a_reader(entries):
    for name, target in entries.items():
        assert callable(registry.load(target)), name


def test_an_unknown_launcher_type_is_refused_naming_the_field_and_the_registered_choices(monkeypatch):
    with pytest.raises(SpecError, match=r"field 'launcher.type': unknown launcher 'slurm'; use one of: "
                                        r"local, docker, kubernetes"):
        parse_spec({"launcher": {"type": "slurm"}})
    monkeypatch.setitem(registry.LAUNCHERS, "slurm", "autodl.launch.local:LocalLauncher")
    assert parse_spec({"launcher": "slurm"}).launcher.type == "slurm"

