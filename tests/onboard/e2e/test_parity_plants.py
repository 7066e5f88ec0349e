"""Parity fails a port with a planted bug and names the module the bug is in.

Three ports written the way an agent writes them, each on the smallest config that holds its
features: GPT-OSS (gpt_oss_port.py: attention sinks, biases, alternating sliding and full layers,
YaRN, a biased top-k router, clamped-SwiGLU experts), dots.llm1 (dots1_port.py: sigmoid,
group-limited routing chosen with a score-correction bias, shared expert, dense first layer,
QK-norm) and SmolLM3 (smollm3_port.py: NoPE layers). Each passes parity as written; each plant
breaks a line or two of one the way a port gets it wrong.

Some plants compute, at the seeded init, the very numbers of the correct port: no expert activation
comes near swiglu_limit (7; they sit near 0.2) and the score-correction bias is zero. Those fail only
where parity drives every declared feature into its active range (the clamp clipping, the bias
non-zero, the sinks taking attention mass, the scores of each kind of layer spread), so these tests
hold that work to account as well as the ports.
"""

from __future__ import annotations

import json

import pytest
from dots1_port import PLANTS as DOTS1_PLANTS
from dots1_port import dots1_workspace
from gpt_oss_port import PLANTS as GPT_OSS_PLANTS
from gpt_oss_port import gpt_oss_workspace
from smollm3_port import PLANTS as SMOLLM3_PLANTS
from smollm3_port import smollm3_workspace
from test_parity_support import edit_file

from onboard.parity.check import check_workspace
from onboard.parity.criteria import asserted_criteria

pytestmark = pytest.mark.hf

PORTS = {
    "gpt_oss": (gpt_oss_workspace, GPT_OSS_PLANTS),
    "dots1": (dots1_workspace, DOTS1_PLANTS),
    "smollm3": (smollm3_workspace, SMOLLM3_PLANTS),
}

# plant -> (port, the native modules that hold the bug: where parity must say the outputs first part)
BUGGY_MODULE = {
    # every MoE layer's experts lose the clamp; the first to run is the first to diverge
    "clamp_removed": ("gpt_oss", {"layers.0.moe.experts", "layers.1.moe.experts"}),
    # layer 0 is the sliding layer, and the first attention to run
    "sinks_dropped": ("gpt_oss", {"layers.0.attention"}),
    "window_off_by_one": ("gpt_oss", {"layers.0.attention"}),
    # the router chooses other experts from the same logits; the MoE block holding it also names it
    "correction_bias_dropped": ("dots1", {"layers.1.moe.router", "layers.1.moe"}),
    # layer 1 is the NoPE layer
    "rope_on_nope_layer": ("smollm3", {"layers.1.attention"}),
}


def failed(m: dict) -> set[str]:
    return {c.name for c in asserted_criteria() if not c.check(m)[0]}


def test_every_plant_names_its_buggy_module():
    plants = {(port, plant) for port, (_, table) in PORTS.items() for plant in table}
    assert plants == {(port, plant) for plant, (port, _) in BUGGY_MODULE.items()}


@pytest.mark.parametrize("port", sorted(PORTS))
def test_port_passes_parity(tmp_path, port):
    workspace, _ = PORTS[port]
    res = check_workspace(workspace(tmp_path, port))
    assert res["error"] is None, res["error"]
    m = res["measurements"]
    assert failed(m) == set(), json.dumps(m, indent=1)
    assert m["first_divergence_module"] is None
    assert not res.get("unconsumed_hf_keys"), res["unconsumed_hf_keys"]  # every config key handled


@pytest.mark.parametrize("plant", sorted(BUGGY_MODULE))
def test_planted_bug_fails_parity_and_is_named(tmp_path, plant):
    port, buggy = BUGGY_MODULE[plant]
    workspace, plants = PORTS[port]
    root = workspace(tmp_path, plant)
    for name, old, new in plants[plant]:
        assert (root / name).read_text().count(old) == 1, f"{plant}: {old!r} is not once in {name}"
        edit_file(root, name, old, new)
    res = check_workspace(root)
    assert res["error"] is None, res["error"]
    m = res["measurements"]
    features = json.dumps(res["features"], indent=1)
    assert failed(m), f"{plant} passes parity; features: {features}"
    assert m["first_divergence_module"] in buggy, (m["first_divergence_module"], res["localisation"]["first"])
