"""Real-size presets: each published model's flavor, built on meta through the recipe path,
has exactly the parameters transformers' own class builds on meta from the published
config.json, the same state-dict names and shapes through the family adapter, and the
config.json reads back as that very flavor.

The configs are the published config.json files' architecture fields, in
tests/real_size_configs.py (one copy, shared with the twin, plan and end-to-end tests).
Nothing is allocated: both sides are built under the meta device, full size (the 94-layer
235B MoE builds in about two seconds on each side).
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="needs the [hf] extra")

from titan_core.config.sections import Model as ModelConfig  # noqa: E402
from titan_core.models.model_builder import build_model_from_config, model_adapter, resolve_model_args  # noqa: E402
from titan_core.models.common.param_counts import count_params  # noqa: E402
from titan_core.models.registry import get_family  # noqa: E402

from real_size_configs import PUBLISHED  # noqa: E402  (tests/ is on the path: its conftest.py)

pytestmark = pytest.mark.hf


def write_config(tmp_path, cfg: dict):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def upstream_on_meta(folder):
    """transformers' own class for the config.json, built on meta (local file, no remote code)."""
    config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config, trust_remote_code=False)


def upstream_active(model, cfg: dict) -> int:
    """Active parameters of the upstream model, counted on its own module names: of each
    layer's routed experts (`mlp.experts.*`), num_experts_per_tok of num_experts are used."""
    total = sum(p.numel() for p in model.parameters())
    n, k = cfg.get("num_experts", 0), cfg.get("num_experts_per_tok", 0)
    experts = sum(p.numel() for name, p in model.named_parameters() if ".mlp.experts." in name)
    assert experts % max(n, 1) == 0
    return total - (experts // n * (n - k) if n else 0)


def shapes(sd: dict) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in sd.items()}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_preset_matches_transformers_on_meta(name, tmp_path):
    family, flavor, cfg = PUBLISHED[name]
    _, _, native = build_model_from_config(ModelConfig(family=family, flavor=flavor))  # `--preset family/flavor`
    assert next(native.parameters()).device.type == "meta"
    upstream = upstream_on_meta(write_config(tmp_path, cfg))

    counts = count_params(native)
    assert counts.total == sum(p.numel() for p in upstream.parameters()), name
    assert counts.active == upstream_active(upstream, cfg), name
    assert counts == count_params(get_family(family).flavors[flavor])  # the args-only path agrees
    # every tensor under its HF name with its HF shape (a tied head is emitted as the embedding, as HF holds it)
    assert shapes(get_family(family).adapter.to_hf(native.state_dict())) == shapes(upstream.state_dict()), name


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_published_config_reads_as_the_preset(name, tmp_path):
    """The recipe path for `--hf-config`: config.json through the family adapter gives the
    flavor's args field for field, with no key of the file left unread."""
    family, flavor, cfg = PUBLISHED[name]
    model_cfg = ModelConfig(family=family, hf_config=str(write_config(tmp_path, cfg) / "config.json"))
    assert resolve_model_args(model_cfg) == get_family(family).flavors[flavor]
    assert model_adapter(model_cfg).unconsumed_keys(cfg) == []


def test_published_sizes():
    """The counts against the model cards (total / active, in billions), and the 235B active
    count by hand from its config: the names on the cards are what users will compare."""
    cards = {"8B": 8.03, "70B": 70.55, "405B": 405.85}
    for flavor, billions in cards.items():
        assert round(count_params(get_family("llama3").flavors[flavor]).total / 1e9, 2) == billions
    assert round(count_params(get_family("qwen3").flavors["32B"]).total / 1e9, 1) == 32.8
    total, active = count_params(get_family("qwen3_moe").flavors["235B-A22B"])
    d, hd, v, layers = 4096, 128, 151936, 94
    attn = d * 64 * hd + 2 * d * 4 * hd + 64 * hd * d + 2 * hd  # q, k, v, o, q_norm, k_norm
    moe_active = d * 128 + 8 * 3 * d * 1536  # router + 8 of 128 SwiGLU experts
    assert active == 2 * v * d + layers * (attn + moe_active + 2 * d) + d
    assert total == active + layers * 120 * 3 * d * 1536  # plus the 120 unchosen experts per layer
    assert (round(total / 1e9), round(active / 1e9)) == (235, 22)


def test_count_params_on_a_shared_expert_moe():
    """A shared expert and the router count in full; only routed experts are shared out."""
    args = replace(get_family("qwen3_moe").flavors["debugmodel"], shared_expert_hidden_dim=64, dense_layers=[0])
    total, active = count_params(args)
    d, e, k, h = args.dim, args.n_experts, args.top_k, args.moe_hidden_dim
    moe_layers = args.n_layers - 1
    assert total - active == moe_layers * (e - k) * 3 * d * h
    with pytest.raises(TypeError):
        count_params({"dim": 4})
