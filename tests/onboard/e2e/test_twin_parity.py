"""Parity on the default twin of a GQA model catches a key/value expansion in the wrong order.

Llama-3.2-1B has 32 query heads on 8 key/value heads, as Llama-3.1-8B has (both twins are 256
wide with 8:2 heads; the 1B's heads are 64 wide, the 8B's 128: parity here costs less). A
port that expands the key/value heads with `repeat` (heads 0..7, 0..7, ...) where upstream uses
`repeat_interleave` (0,0,0,0, 1,1,1,1, ...) pairs most query heads with the wrong keys. A twin
with one key/value head cannot show it (both orders copy the one head); the default twin keeps
8:2, where they differ. Parity runs in process (`check_workspace`, as the workspace's
test_parity.py calls it) on the twin the workspace scaffolds, with titan_core's attention core
replaced by one that expands the heads explicitly: in upstream's order it passes, in the other
it fails.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from onboard.parity.check import check_workspace
from onboard.parity.criteria import asserted_criteria
from onboard.sizing.twin.setup import apply_twin
from onboard.workspace.scaffold import plan_workspace, write_workspace
from real_size_configs import PUBLISHED
from titan_core.models.common import attention

pytest.importorskip("transformers", reason="parity compares with the upstream class")
pytestmark = pytest.mark.hf


def expanding_core(order: str):
    """An SDPA core that expands the key/value heads itself, in `order` (`repeat_interleave`: upstream's)."""

    def expand(t: torch.Tensor, rep: int) -> torch.Tensor:
        return t.repeat_interleave(rep, dim=1) if order == "repeat_interleave" else t.repeat(1, rep, 1, 1)

    def forward(self, q, k, v, *, scale, window, segment_ids, softcap=None, causal=True):
        assert window is None and segment_ids is None and softcap is None  # Llama's parity: plain causal
        rep = q.shape[1] // k.shape[1]
        return F.scaled_dot_product_attention(q, expand(k, rep), expand(v, rep), is_causal=causal, scale=scale)

    return forward


def failed(res: dict) -> set[str]:
    return {c.name for c in asserted_criteria() if not c.check(res["measurements"])[0]}


def test_wrong_kv_expansion_fails_parity_on_the_default_twin(tmp_path, monkeypatch):
    cfg_path = tmp_path / "config.json"
    cfg_path.write_text(json.dumps(PUBLISHED["Llama-3.2-1B"][2]))
    plan = plan_workspace("l1", tmp_path, hf_config=cfg_path, device="cpu")
    apply_twin(plan, mode="on")
    root = write_workspace(plan)
    twin = plan.twin["config"]
    assert (twin["num_attention_heads"], twin["num_key_value_heads"]) == (8, 2)  # 32:8 as 8:2

    results = {}
    for order in ("repeat_interleave", "repeat"):
        monkeypatch.setattr(attention.SDPAttention, "forward", expanding_core(order))
        results[order] = check_workspace(root, batch=1)
    right, wrong = results["repeat_interleave"], results["repeat"]
    assert right["model"] == wrong["model"] == "twin (twin.json)"
    assert right["error"] is None and failed(right) == set(), right["measurements"]
    assert wrong["error"] is None
    assert {"logits_rel_l2", "loss_abs_diff"} <= failed(wrong)
    # the divergence starts in the first layer's attention (its core has no parameters to name)
    assert wrong["measurements"]["first_divergence_module"].startswith("layers.0.attention")
