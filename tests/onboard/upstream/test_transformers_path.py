"""The transformers path's model (titan_core/models/transformers) and its attention kernels
(titan_core/models/transformers/hf_attention.py): the native decoder's contract around transformers' own
class, seeded init, the loss against transformers' own loss, fused_ce's memory, kernel calls."""

from __future__ import annotations

import subprocess
import sys

import pytest
from one_thread import one_thread  # noqa: F401 (autouse: one intra-op thread, tests/one_thread.py)
import torch
from hang_guard import hang_guard

from titan_core.config import ConfigError
from titan_core.models.common.swaps import apply_swaps
from titan_core.kernels import swaps_for
from titan_core.kernels.attention import KernelUnavailable
from titan_core.config.sections import Kernels
from titan_core.models.common.attention import NaiveAttention, SDPAttention
from titan_core.models.registry import build_meta
from titan_core.measure.numerics import rel_l2
from titan_core.memory.tensor_peak import TensorPeak

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

BASE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=256, max_position_embeddings=256)  # fmt: skip
CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(**BASE),
    # final and attention soft-caps, a window, a tied head
    "gemma2": lambda: transformers.Gemma2Config(**BASE, head_dim=16, sliding_window=8, final_logit_softcapping=3.0),
    # logits divided by logits_scaling
    "granite": lambda: transformers.GraniteConfig(**BASE, logits_scaling=0.25, embedding_multiplier=4.0),
    # decoder layers in `transformer.h`, learned positions, a tied head named `wte`; dropout off
    "gpt2": lambda: transformers.GPT2Config(
        n_embd=64,
        n_layer=2,
        n_head=4,
        vocab_size=256,
        n_positions=256,
        attn_pdrop=0.0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    ),
}


def hf_dict(model_type: str) -> dict:
    return CONFIGS[model_type]().to_dict()


def wrapped(model_type: str, seed: int = 0, cfg: dict | None = None):
    """The transformers family's model as the trainer builds it: on meta, materialised, seeded init."""
    from titan_core.models.transformers import ADAPTER

    args, _ = ADAPTER.args_from_hf(cfg or hf_dict(model_type))
    model = build_meta("transformers", args)
    model.to_empty(device="cpu")
    model.init_weights(seed=seed)
    return model


def plain(model_type: str, cfg: dict | None = None, impl: str = "eager"):
    """The same transformers class, built plainly (no titan_core), fp32."""
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config = CONFIG_MAPPING[model_type].from_dict(cfg or hf_dict(model_type))
    return AutoModelForCausalLM.from_config(config, attn_implementation=impl, dtype=torch.float32)


def test_contract_matches_the_native_decoder():
    model = wrapped("llama")
    hf = plain("llama")
    # transformers' own names: the adapter of this path is the identity
    assert list(model.state_dict()) == list(hf.state_dict())
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in hf.parameters())
    # the decoder blocks, for FSDP2 units, per-block compile and the Graph Trainer's block tags
    assert isinstance(model.layers, torch.nn.ModuleDict) and list(model.layers) == ["0", "1"]
    assert all(model.layers[str(i)] is model.model.layers[i] for i in range(2))
    assert "layers.0" not in dict(model.named_modules())  # a view: the blocks keep their transformers paths
    tokens = torch.randint(0, 256, (2, 16))
    loss, ce = model.loss(tokens, torch.randint(0, 256, (2, 16)))
    assert loss is ce and loss.ndim == 0  # no auxiliary term
    assert model(tokens).shape == (2, 16, 256)
    # every attention module holds a swappable core, found under the native swap path
    assert [type(c) for c in model.attention_cores()] == [SDPAttention, SDPAttention]
    swapped = apply_swaps(model, swaps_for(Kernels(attention="naive", loss="fused_ce")))
    assert swapped == {
        "loss_head": "loss.fused_ce",
        "model.layers.0.self_attn.core": "attention.naive",
        "model.layers.1.self_attn.core": "attention.naive",
    }
    assert [type(c) for c in model.attention_cores()] == [NaiveAttention, NaiveAttention]


def test_init_is_transformers_own_and_reproducible():
    before = torch.random.get_rng_state()
    a, b, c = wrapped("gemma2", seed=3), wrapped("gemma2", seed=3), wrapped("gemma2", seed=4)
    assert torch.equal(torch.random.get_rng_state(), before)  # the seeded draw leaves the global generator alone
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["model.layers.0.mlp.up_proj.weight"], sc["model.layers.0.mlp.up_proj.weight"])
    # transformers' init: Gemma's (1 + w) norms start at 0, Linear weights at initializer_range
    assert torch.count_nonzero(sa["model.norm.weight"]) == 0
    std = float(sa["model.layers.0.mlp.up_proj.weight"].std())
    assert abs(std - hf_dict("gemma2")["initializer_range"]) < 0.003
    # the tied head is the embedding again after to_empty
    assert a.output_weight is a.model.embed_tokens.weight
    # the rotary buffers were recomputed, not left as to_empty's garbage
    assert torch.allclose(a.model.rotary_emb.inv_freq, plain("gemma2").model.rotary_emb.inv_freq)


@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_loss_equals_transformers_own_loss_on_the_same_weights(model_type):
    model = wrapped(model_type)
    hf = plain(model_type)
    hf.load_state_dict(model.state_dict())
    full = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(0))
    # titan_core's labels are shifted already; transformers shifts its own
    _, ce = model.loss(full[:, :-1], full[:, 1:])
    want = hf(input_ids=full, labels=full).loss
    assert abs(ce.item() - want.item()) <= 1e-6 * want.item(), (ce.item(), want.item())
    # the logits too: soft-cap (gemma2) and logits_scaling (granite) applied where the class applies them
    with torch.no_grad():
        got, ref = model(full), hf(input_ids=full).logits
    assert rel_l2(got, ref) < 1e-6


def test_layers_found_where_the_class_keeps_them_and_a_tied_head_compared_under_both_names():
    from onboard.parity.compare import compare_grads
    from titan_core.models.transformers import ADAPTER

    model = wrapped("gpt2")
    assert model.base_prefix == "transformer.h" and len(model.layers) == 2
    assert model.output_weight is model.transformer.wte.weight
    hf = plain("gpt2")
    hf.load_state_dict(model.state_dict())
    full = torch.randint(0, 256, (2, 17), generator=torch.Generator().manual_seed(1))
    model.loss(full[:, :-1], full[:, 1:])[1].backward()
    hf(input_ids=full, labels=full).loss.backward()
    report = compare_grads(hf, model, ADAPTER.to_hf)
    assert not report.missing and not report.extra and "lm_head.weight" in report.per_param
    assert report.max_rel_l2 < 1e-5, report.worst_param


def test_a_tied_head_under_its_own_name_is_not_named_twice():
    # BioGPT's tied head is `output_projection`: the HF form is its class's own names, no lm_head
    from titan_core.models.transformers import ADAPTER

    cfg = transformers.BioGptConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=128, vocab_size=256).to_dict()  # fmt: skip
    model = wrapped("biogpt", cfg=cfg)
    theirs = plain("biogpt", cfg=cfg).state_dict()
    assert set(ADAPTER.to_hf(model.state_dict(keep_vars=True))) == set(theirs)
    assert "lm_head.weight" not in theirs and "output_projection.weight" in theirs


def test_fused_ce_never_materialises_the_logits():
    cfg = {**hf_dict("llama"), "vocab_size": 8192}
    tokens = torch.randint(0, 8192, (2, 256))
    labels = torch.randint(0, 8192, (2, 256))
    logits_bytes = tokens.numel() * 8192 * 4

    def peak(loss: str) -> tuple[int, float]:
        model = wrapped("llama", cfg=cfg)
        apply_swaps(model, swaps_for(Kernels(loss=loss, ce_chunk=64)))
        with TensorPeak() as p:
            _, ce = model.loss(tokens, labels)
            ce.backward()
        return p.peak_bytes, ce.item()

    plain_peak, plain_loss = peak("plain")
    fused_peak, fused_loss = peak("fused_ce")
    assert abs(fused_loss - plain_loss) <= 1e-5 * plain_loss
    assert plain_peak - fused_peak >= logits_bytes, (plain_peak, fused_peak, logits_bytes)


def test_the_model_calls_the_registered_kernel(monkeypatch):
    calls = []
    for cls in (SDPAttention, NaiveAttention):
        forward = cls.forward

        def counting(self, *a, _forward=forward, _cls=cls, **kw):
            calls.append(_cls.__name__)
            return _forward(self, *a, **kw)

        monkeypatch.setattr(cls, "forward", counting)
    model = wrapped("llama")
    tokens = torch.randint(0, 256, (2, 16))
    model.loss(tokens, tokens)
    assert calls == ["SDPAttention", "SDPAttention"]  # each layer's attention call lands on titan_core's core
    # a plain transformers model with attn_implementation="titan_naive" (the fixed registration) too
    calls.clear()
    hf = plain("llama", impl="titan_naive")
    hf.load_state_dict(model.state_dict())
    out = hf(input_ids=tokens).logits
    assert calls == ["NaiveAttention", "NaiveAttention"]
    assert rel_l2(model(tokens), out) < 1e-6


def test_kernels_honour_what_the_model_passes_or_refuse():
    # gemma2: the naive core applies the score soft-cap and the window; its parity is the proof
    model = wrapped("gemma2")
    assert [type(c) for c in model.attention_cores()] == [NaiveAttention, NaiveAttention]
    hf = plain("gemma2")
    hf.load_state_dict(model.state_dict())
    tokens = torch.randint(0, 256, (1, 24))  # longer than the window of 8
    ref = hf(input_ids=tokens).logits
    assert rel_l2(model(tokens), ref) < 1e-6
    # sdpa cannot cap scores: refused with the reason and the kernel that can
    apply_swaps(model, ["attention.sdpa"])  # what the default kernels.attention would put there
    with pytest.raises(KernelUnavailable, match="soft-cap.*kernels.attention=naive"):
        model.loss(tokens, tokens)


def test_packed_documents_reach_the_kernel():
    model = wrapped("llama")
    tokens = torch.randint(0, 256, (1, 16))
    segments = torch.tensor([[0] * 8 + [1] * 8])
    positions = torch.cat([torch.arange(8), torch.arange(8)])[None]
    packed = model(tokens, positions=positions, segment_ids=segments)
    # the second document attends only to itself: as if it had been run alone
    alone = model(tokens[:, 8:])
    assert torch.allclose(packed[:, 8:], alone, atol=1e-5)


def test_transformers_missing_is_a_config_error(monkeypatch):
    from titan_core.models.model_builder import resolve_model_args
    from titan_core.config.sections import Model

    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'titan-onboard\[hf\]'"):
        resolve_model_args(Model(family="transformers", flavor="debugmodel"))


def test_hf_attention_lives_with_the_transformers_path():
    # it serves only the transformers path, so it sits in that package, not among the swappable kernels
    import importlib.util

    import titan_core.models.transformers.hf_attention as hf_attention

    assert hf_attention.__name__ == "titan_core.models.transformers.hf_attention"
    assert callable(hf_attention.register_hf_attention)
    assert importlib.util.find_spec("titan_core.kernels.hf_attention") is None


def test_titan_core_imports_without_transformers():
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "import titan_core.training.trainer, titan_core.models.transformers\n"
        "import titan_core.models.transformers.hf_attention\n"
        "from titan_core.models import get_family\n"
        "print(get_family('transformers').name)"
    )
    with hang_guard(120, "importing titan_core without transformers") as guard:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=guard.timeout_s)
    assert out.returncode == 0 and out.stdout.strip() == "transformers", out.stderr


def test_new_model_offers_both_paths_for_an_unknown_model_type(tmp_path):
    import json

    from onboard.errors import BadInput
    from onboard.workspace.scaffold import plan_workspace

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(hf_dict("gemma2")))
    with pytest.raises(BadInput, match="--path transformers .*--path port"):
        plan_workspace("g", tmp_path, hf_config=cfg, device="cpu")
    plan = plan_workspace("g", tmp_path, hf_config=cfg, device="cpu", path="transformers")
    assert (plan.family, plan.path_kind, plan.unconsumed) == ("transformers", "transformers", [])
    assert 'attention = "naive"' in plan.files["recipe.toml"]  # gemma2 soft-caps its scores
    assert "TransformersAdapter()" in plan.files["adapter.py"]
    assert not (tmp_path / "onboarding").exists()  # planning writes nothing


def test_what_the_path_cannot_run_is_refused_with_the_reason():
    """A config without the sizes of a stack of layers (BLT: byte-level, its sizes per sub-model) is
    refused with an AdapterError naming why, not wrong numbers or an AttributeError. (One with no
    attention sizes, Mamba, is a stack: test_transformers_stacks.py runs it.)"""
    from titan_core.models.common.mapping_errors import AdapterError
    from titan_core.models.transformers import ADAPTER

    with pytest.raises(AdapterError, match="BltConfig has no hidden_size, num_hidden_layers: "):
        ADAPTER.args_from_hf(transformers.BltConfig().to_dict())
