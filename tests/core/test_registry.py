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


def test_an_unknown_launcher_type_is_refused_naming_the_field_and_the_registered_choices():
    with pytest.raises(SpecError, match=r"field 'launcher.type': unknown launcher 'slurm'; use one of: "
                                        r"local, docker, kubernetes"):
        parse_spec({"launcher": {"type": "slurm"}})


def test_every_launcher_has_its_options_in_the_spec_union():
    """The spec's launcher section is validated as the options of the launcher its type names: each registered
    launcher's class declares them (``options``), and the union holds exactly those, keyed on ``type``."""
    from autodl.spec import LAUNCHER_OPTIONS

    assert list(LAUNCHER_OPTIONS) == list(registry.LAUNCHERS)
    for name, target in registry.LAUNCHERS.items():
        options = registry.load(target).options
        assert LAUNCHER_OPTIONS[name] is options
        assert parse_spec({"launcher": name}).launcher == options()
        assert options().type == name

