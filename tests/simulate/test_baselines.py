"""The simulator's baseline policies, placed by the product's ``place`` on small pools with known right answers."""

from __future__ import annotations

import pytest

from autodl.policy import place, policy_names
from autodl.spec import ResourcePolicySection
from autodl_sim.baselines import BASELINES
from tests.policy.test_place import dev, inv, prof

pytestmark = pytest.mark.simulator


def test_importing_the_baselines_registers_them():
    assert set(BASELINES) <= set(policy_names())


def test_fits_only_without_headroom(catalog):
    """36 GiB > 0.85 x 40 GiB: rule_based skips the A100-40GB for the 80GB; first-fit (no headroom) takes it."""
    i = inv(dev(catalog, 0, "A100-SXM4-40GB"), dev(catalog, 1, "A100-SXM4-80GB"))
    d = place(prof(36), i, catalog=catalog, policy=ResourcePolicySection())
    assert d.chosen.model == "A100-SXM4-80GB"
    dropped = next(c for c in d.candidates if not c.kept)
    assert dropped.model == "A100-SXM4-40GB" and "never fits" in dropped.reasons[0]
    d = place(prof(36), i, catalog=catalog, policy=ResourcePolicySection(), algorithm="fifo_first_fit")
    assert d.chosen.model == "A100-SXM4-40GB"


def test_baselines_known_answers(catalog):
    i = inv(dev(catalog, 0, "A100-SXM4-80GB"), dev(catalog, 1, "T4"), dev(catalog, 2, "RTX-3090"))
    p = ResourcePolicySection()
    assert place(prof(4), i, catalog=catalog, policy=p, algorithm="best_fit_memory").chosen.model == "T4"
    assert place(prof(4), i, catalog=catalog, policy=p, algorithm="fifo_first_fit").chosen.model == "A100-SXM4-80GB"
    # fp32 compute-bound: RTX 3090 (35.6 TFLOPS) beats A100 (19.5) and T4 (8.1)
    assert place(prof(4, flops=1e15), i, catalog=catalog, policy=p,
                 algorithm="gavel_max_throughput").chosen.model == "RTX-3090"
    r1 = place(prof(4), i, catalog=catalog, policy=p, algorithm="random", seed=7)
    r2 = place(prof(4), i, catalog=catalog, policy=p, algorithm="random", seed=7)
    assert r1 == r2.model_copy(update={})
