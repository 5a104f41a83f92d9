"""GPU catalog: the models the issue lists, every entry sourced, NVML names resolve."""

from __future__ import annotations

import shutil

import pytest

from autodl.catalog import load_catalog
from autodl.config import include_dir
from autodl.errors import CatalogError

REQUIRED = ["A100-SXM4-40GB", "A100-SXM4-80GB", "H100-SXM5-80GB", "H200-SXM-141GB", "V100-PCIE-16GB",
            "V100-PCIE-32GB", "T4", "A10", "L4", "L40S", "RTX-3090", "RTX-4090", "Ascend-910", "Ascend-910B",
            "Kunlun-R200"]


def test_required_models_present_with_sources(catalog):
    for name in REQUIRED:
        m = catalog.get(name)
        assert m.source.startswith("https://"), name
        assert m.memory_bytes > 8 * 2**30
        assert m.memory_bandwidth_gbps > 0
        assert m.peak_tflops("fp32") > 0 and m.peak_tflops("fp16") > 0


@pytest.mark.parametrize("nvml_name,expected", [
    ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"),
    ("Tesla V100-PCIE-32GB", "V100-PCIE-32GB"),
    ("NVIDIA GeForce RTX 3090", "RTX-3090"),
    ("NVIDIA H200", "H200-SXM-141GB"),
    ("Tesla T4", "T4"),
    ("rtx 4090", "RTX-4090"),
])
def test_nvml_names_resolve(catalog, nvml_name, expected):
    assert catalog.get(nvml_name).name == expected


def test_unknown_model_error_lists_known(catalog):
    with pytest.raises(CatalogError, match="not in the GPU catalog.*A100-SXM4-40GB"):
        catalog.get("Voodoo 2")


def test_domestic_tags_and_vendors(catalog):
    assert "domestic" in catalog.get("Ascend-910").tags
    assert catalog.get("Kunlun-R200").vendor == "kunlun"
    assert catalog.vendor("ascend").visible_devices_env == "ASCEND_RT_VISIBLE_DEVICES"
    assert catalog.vendor("nvidia").k8s_resource == "nvidia.com/gpu"
    with pytest.raises(CatalogError, match="vendors.yaml"):
        catalog.vendor("3dfx")


def test_fp32_fallback_is_half_fp16_when_unpublished(catalog):
    ascend = catalog.get("Ascend-910")
    assert ascend.fp32_tflops is None
    assert ascend.peak_tflops("fp32") == pytest.approx(ascend.fp16_tflops / 2)


def test_bad_entry_names_model_and_field(tmp_path):
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text("models:\n  - name: X\n    vendor: nvidia\n    memory_bytes: -1\n    memory_bandwidth_gbps: 1\n    source: s\n")
    shutil.copy(include_dir() / "catalog" / "vendors.yaml", tmp_path / "vendors.yaml")
    with pytest.raises(CatalogError, match="model X: field 'memory_bytes'"):
        load_catalog(gpus)


def test_empty_catalog_and_missing_vendor_table(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(CatalogError, match="non-empty 'models:' list"):
        load_catalog(empty)
    lonely = tmp_path / "lonely" / "gpus.yaml"
    lonely.parent.mkdir()
    shutil.copy(include_dir() / "catalog" / "gpus.yaml", lonely)
    with pytest.raises(CatalogError, match=r"vendor table is missing.*beside the GPU catalog"):
        load_catalog(lonely)
