"""The flux family against diffusers' FluxTransformer2DModel (fp32, CPU, random weights), its
adapter and config both ways, the flow loss, its FLOP count and its synthetic data."""

import dataclasses
import inspect

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from titan_core.config.loader import ConfigError
from titan_core.measure.numerics import rel_l2
from titan_core.models.common.attention import NaiveAttention
from titan_core.models.common.mapping_errors import AdapterError
from titan_core.models.flux.args import FluxArgs
from titan_core.models.flux.samples import FlowLoader
from titan_core.models.registry import apply_model_overrides, build_meta, get_family

FAMILY = get_family("flux")
ARGS = FAMILY.flavors["debugmodel"]


def _model(args=ARGS, std=0.1, seed=0):
    """The flux model with every weight drawn (modulation and output too, which init zeroes)."""
    m = build_meta("flux", args)
    m.to_empty(device="cpu")
    m.init_weights(seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * std)
    return m


def _diffusers(model):
    from diffusers import FluxTransformer2DModel

    cfg = FAMILY.adapter.hf_config(model.args)
    takes = inspect.signature(FluxTransformer2DModel.__init__).parameters
    ref = FluxTransformer2DModel(**{k: v for k, v in cfg.items() if k in takes})
    ref.load_state_dict(FAMILY.adapter.to_hf(model.state_dict()), strict=True)
    return ref


def _sample(model, batch=2, seed=5):
    return model.args.own_samples(seed=seed, batch_size=batch, seq_len=model.args.image_tokens,
                                  repeat_batch=True).batch_at(0)  # fmt: skip


def _ids(cfg: FluxArgs):
    rows = torch.arange(cfg.latent_height).repeat_interleave(cfg.latent_width)
    cols = torch.arange(cfg.latent_width).repeat(cfg.latent_height)
    return torch.stack([torch.zeros_like(rows), rows, cols], -1).float(), torch.zeros(cfg.text_len, 3)


def _their_prediction(ref, cfg, latents, inp):
    img_ids, txt_ids = _ids(cfg)
    return ref(latents, encoder_hidden_states=inp["text"], pooled_projections=inp["pooled"],
               timestep=inp["timesteps"], img_ids=img_ids, txt_ids=txt_ids, guidance=inp.get("guidance")).sample  # fmt: skip


def test_prediction_and_gradients_match_diffusers():
    ours = _model()
    ref = _diffusers(ours)
    b = _sample(ours)
    mine = ours(b.tokens, timesteps=b.inputs["timesteps"], text=b.inputs["text"], pooled=b.inputs["pooled"],
                guidance=b.inputs["guidance"])  # fmt: skip
    theirs = _their_prediction(ref, ours.args, b.tokens, b.inputs)
    assert theirs.norm() > 1.0
    assert rel_l2(mine, theirs) <= 1e-5
    cot = torch.randn(mine.shape, generator=torch.Generator().manual_seed(9))
    (mine * cot).sum().backward()
    (theirs * cot).sum().backward()
    their_grads = FAMILY.adapter.from_hf({k: p.grad for k, p in ref.named_parameters()})
    worst = max(rel_l2(p.grad, their_grads[name]) for name, p in ours.named_parameters())
    assert worst <= 1e-4


def test_loss_is_the_rectified_flow_mse_of_the_velocity():
    ours = _model()
    ref = _diffusers(ours)
    b = _sample(ours)
    loss, same = ours.loss(b.tokens, b.labels, **b.loss_kwargs())
    assert loss is same  # no auxiliary term
    t = b.inputs["timesteps"][:, None, None]
    noisy = (1 - t) * b.tokens + t * b.inputs["noise"]
    expected = (_their_prediction(ref, ours.args, noisy, b.inputs) - (b.inputs["noise"] - b.tokens)).pow(2).mean()
    assert rel_l2(loss, expected) <= 1e-5
    # a label of -100 takes an image token out of the mean
    labels = b.labels.clone()
    labels[:, ours.args.image_tokens // 2 :] = -100
    assert rel_l2(ours.loss(b.tokens, labels, **b.loss_kwargs())[0], loss) > 1e-4


def test_weights_and_config_round_trip_through_diffusers_names():
    m = _model()
    hf = FAMILY.adapter.to_hf(m.state_dict())
    assert any(k.startswith("single_transformer_blocks.1.") for k in hf)
    back = FAMILY.adapter.from_hf(hf)
    assert back.keys() == m.state_dict().keys()
    assert all(torch.equal(back[k], v) for k, v in m.state_dict().items())
    args, used = FAMILY.adapter.args_from_hf(FAMILY.adapter.hf_config(ARGS))
    assert args == ARGS and "num_single_layers" in used


@pytest.mark.parametrize(
    "change, match",
    [
        ({"_class_name": "SD3Transformer2DModel"}, "FluxTransformer2DModel"),
        ({"patch_size": 2}, "patch_size"),
        ({"axes_dims_rope": [4, 4, 6]}, r"axes_dims_rope = \[4, 4, 6\] is not accepted; .* attention_head_dim = 16"),
        ({"out_channels": 16}, "out_channels"),
    ],
)
def test_configs_the_family_cannot_build_are_refused_with_why(change, match):
    with pytest.raises(AdapterError, match=match):
        FAMILY.adapter.args_from_hf({**FAMILY.adapter.hf_config(ARGS), **change})


def test_a_derived_size_is_refused_naming_the_fields_it_follows_from():
    """n_layers, dim, ... are FluxArgs properties: an override of one would be ignored, so it is refused."""
    with pytest.raises(ConfigError, match="n_layers is n_double_layers \\+ n_single_layers; override those"):
        apply_model_overrides(ARGS, {"n_layers": 6})
    with pytest.raises(ConfigError, match="n_heads x head_dim"):
        apply_model_overrides(ARGS, {"dim": 64})
    with pytest.raises(ConfigError, match="unknown model override 'extra'"):  # no port table to hide sizes in
        apply_model_overrides(ARGS, {"extra": {"flux": {"n_single_layers": 3}}})


def test_the_sizes_changed_in_flux_fields_are_the_models():
    """What the refusal's message says to do works: one FluxArgs field, the rest kept, the summary with it."""
    deeper = apply_model_overrides(ARGS, {"n_single_layers": 3, "n_heads": 2})
    assert isinstance(deeper, FluxArgs)
    assert (deeper.n_double_layers, deeper.n_single_layers, deeper.n_heads, deeper.in_channels) == (2, 3, 2, 64)
    assert (deeper.n_layers, deeper.n_heads, deeper.dim, deeper.ffn_hidden_dim) == (5, 2, 32, 128)
    model = build_meta("flux", deeper)
    assert len(model.layers) == 5 and model.args == deeper
    with pytest.raises(ConfigError, match="flux n_heads = 0 is not accepted"):
        apply_model_overrides(ARGS, {"n_heads": 0})


def test_flops_per_sample_counts_every_matmul_of_a_training_step():
    m = _model()
    for block in m.layers.values():
        block.attention.core = NaiveAttention()  # matmuls the counter sees (sdpa's CPU kernel it does not)
    b = _sample(m, batch=1)
    # inputs that require grad: the counter then sees every weight's 6 FLOPs, as the formula counts them
    inputs = {k: v.requires_grad_() if v.is_floating_point() else v for k, v in b.inputs.items()}
    with FlopCounterMode(display=False) as counter:
        m.loss(b.tokens.requires_grad_(), b.labels, **inputs)[0].backward()
    assert counter.get_total_flops() == m.flops_per_sample()
    assert m.flops_per_token() == m.flops_per_sample() / m.args.image_tokens


def test_flow_samples_are_a_function_of_their_index_and_split_across_ranks():
    cfg = build_meta("flux", ARGS).args
    kw = dict(flux=cfg, seed=3, seq_len=cfg.image_tokens, repeat_batch=False)
    whole = FlowLoader(batch_size=2, dp_rank=0, dp_world=1, **kw).batch_at(1)
    halves = [FlowLoader(batch_size=1, dp_rank=r, dp_world=2, **kw).batch_at(1) for r in (0, 1)]
    for name, t in whole.present().items():
        assert torch.equal(t, torch.cat([h.present()[name] for h in halves])), name
    assert set(whole.inputs) == {"noise", "timesteps", "text", "pooled", "guidance"}
    assert whole.tokens.shape == (2, cfg.image_tokens, cfg.in_channels)
    assert ((whole.inputs["timesteps"] > 0) & (whole.inputs["timesteps"] < 1)).all()
    assert not torch.equal(whole.tokens, FlowLoader(batch_size=2, dp_rank=0, dp_world=1, **kw).batch_at(0).tokens)
    with pytest.raises(ConfigError, match="set training.seq_len = 64"):
        FlowLoader(batch_size=1, dp_rank=0, dp_world=1, **{**kw, "seq_len": 32})


def test_schnell_has_no_guidance_embedder():
    schnell = dataclasses.replace(FluxArgs(guidance_embeds=False, n_double_layers=1, n_single_layers=1,
                                           n_heads=2, head_dim=16, axes_dims_rope=(4, 6, 6)))  # fmt: skip
    m = build_meta("flux", schnell)
    assert m.guidance_in is None and not any("guidance" in k for k in FAMILY.adapter.to_hf(m.state_dict()))
