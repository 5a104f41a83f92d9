"""The NVML source names its host as the steps do: in a container the host name is the container's, so
``AUTODL_HOST`` (set on each GPU worker) names the machine for the inventory and for the check that a
local launch runs on the booked host alike."""

from __future__ import annotations

import socket

from autodl.hosts import require_here
from autodl.inventory.nvml import read_nvml


def test_nvml_devices_carry_autodl_host(fake_nvml, catalog, monkeypatch):
    fake_nvml("A14-nvml.json")
    monkeypatch.setenv("AUTODL_HOST", "gpu-node-7")
    inventory = read_nvml(catalog)
    assert inventory.devices and {d.host for d in inventory.devices} == {"gpu-node-7"}
    require_here(inventory.devices[0].host, "start the training", "k")  # same name: no error
    monkeypatch.delenv("AUTODL_HOST")
    assert {d.host for d in read_nvml(catalog).devices} == {socket.gethostname()}
