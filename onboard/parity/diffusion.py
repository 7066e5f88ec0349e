"""Parity of a flux workspace against diffusers' FluxTransformer2DModel, CPU fp32, same weights.

The same measurements as a language model's parity (check.py), so one checklist judges both:
the state-dict round trip through the workspace adapter, the prediction (`logits_*`: the
model's output, here the velocity [batch, image tokens, channels]), the rectified-flow loss
(`loss_abs_diff`) and every parameter's gradient. The sample size is not a weight, so parity
runs at a joint sequence of at least the checklist's seq_len (image + text tokens) whatever
the recipe trains at; the one declared feature, the guidance embedding of a guidance-distilled
model, is exercised when its embedder's gradient is not zero.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from pathlib import Path
from typing import Any

import torch

from titan_core.measure.numerics import max_abs, rel_l2
from titan_core.models.flux.args import FluxArgs

from onboard.parity import criteria
from onboard.parity.compare import compare_grads, round_trip
from onboard.parity.localise import OutputRecorder, compare_outputs, divergence, module_pairs, parameter_sources
from onboard.parity.native import build_native, load_adapter, load_converted, native_args
from onboard.upstream.hf_model import Upstream, UpstreamError, perturb_constants, weight_files


NO_UPSTREAM_INIT = (
    "not compared: diffusers' FluxTransformer2DModel defines no init of its own (its layers keep torch's "
    "defaults), so there is no upstream init to match; the native flux init is the DiT/Flux training one "
    "(normal(0, init_std), zero biases, zero modulation and output projection)"
)
"""Why init parity (onboard/upstream/init_check.py) does not apply to a flux workspace."""


def _require_diffusers():
    try:
        from diffusers import FluxTransformer2DModel  # lazy: the [diffusers] extra; absence becomes UpstreamError
    except ImportError:
        raise UpstreamError("flux parity needs diffusers: pip install 'titan-onboard[diffusers]'") from None
    return FluxTransformer2DModel


def diffusers_model(cfg: dict[str, Any]):
    """diffusers' FluxTransformer2DModel built from the config's constructor keys (on the current
    default device: under `torch.device("meta")` it allocates nothing)."""
    cls = _require_diffusers()
    takes = inspect.signature(cls.__init__).parameters
    return cls(**{k: v for k, v in cfg.items() if k in takes and k != "self"})


def build_flux_upstream(cfg: dict[str, Any], *, weights_dir: Path | None, seed: int) -> Upstream:
    """diffusers' FluxTransformer2DModel for `cfg`, fp32 on CPU, in eval mode, seeded or from the
    safetensors files in `weights_dir` (a tensor missing, unused or of another shape is counted)."""
    with torch.random.fork_rng(devices=[]):  # diffusers init draws from the global generator
        torch.manual_seed(seed)
        model = diffusers_model(cfg).float()
    loading: dict[str, Any] = {}
    if weights_dir is None:
        perturb_constants(model, seed)
        source = f"seed={seed}"
    else:
        from safetensors.torch import load_file  # lazy: the [hf] extra, only to read a weights folder

        files = weight_files(Path(weights_dir), stem="diffusion_pytorch_model")
        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(load_file(str(f)))
        own = model.state_dict()
        mismatched = sorted(f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}"
                            for k, v in state.items() if k in own and v.shape != own[k].shape)  # fmt: skip
        fitting = {k: v.float() for k, v in state.items() if k in own and v.shape == own[k].shape}
        model.load_state_dict(fitting, strict=False)
        loading = {
            "files": [f.name for f in files],
            "expected": len(own),
            "missing": sorted(set(own) - set(state)),
            "unexpected": sorted(set(state) - set(own)),
            "mismatched": mismatched,
        }
        source = str(weights_dir)
    model = model.eval()
    return Upstream(model=model, checkpoint=model.state_dict(), source=source, loading=loading)


def parity_sample(args: FluxArgs, seq_len: int) -> FluxArgs:
    """Args whose sample is at least `seq_len` joint tokens: text tokens, then a square latent grid."""
    if args.max_seq_len >= seq_len:
        return args
    side = math.ceil(math.sqrt(seq_len / 2))
    return dataclasses.replace(args, latent_height=side, latent_width=side, text_len=seq_len - side * side)


def _ids(fc):
    rows = torch.arange(fc.latent_height).repeat_interleave(fc.latent_width)
    cols = torch.arange(fc.latent_width).repeat(fc.latent_height)
    return torch.stack([torch.zeros_like(rows), rows, cols], -1).float(), torch.zeros(fc.text_len, 3)


def run_flow(ws, cfg, res, m, *, root: Path, weights_dir, batch: int, seed: int) -> None:
    """check.py's `_run` for a flux workspace: fills `res` and its measurements `m`."""
    upstream = build_flux_upstream(cfg, weights_dir=weights_dir, seed=seed)
    hf = upstream.model
    res.update(upstream_class=type(hf).__name__, weights=upstream.source, weights_check=upstream.loading)
    m.update(upstream.counts())
    adapter = load_adapter(root)
    res["unconsumed_hf_keys"] = adapter.unconsumed_keys(cfg) if callable(getattr(adapter, "unconsumed_keys", None)) else []
    args = parity_sample(native_args(ws, adapter, cfg), int(criteria.threshold("seq_len")))
    native = build_native(ws, args, seed=seed + 1000)
    load = load_converted(native, adapter.from_hf(upstream.checkpoint))
    rt = round_trip(upstream.checkpoint, adapter.to_hf(native.state_dict()))
    m.update(state_dict_same_keys=rt.same_keys, state_dict_max_abs_diff=rt.max_abs_diff, seq_len=args.max_seq_len)
    res["state_dict"] = rt.record(load)
    res["sample"] = {"image_tokens": args.image_tokens, "text_tokens": args.text_len, "batch": batch}

    b = args.own_samples(seed=seed, batch_size=batch, seq_len=args.image_tokens, repeat_batch=True).batch_at(0)
    inp = b.inputs
    t = inp["timesteps"][:, None, None]
    noisy = (1 - t) * b.tokens + t * inp["noise"]
    img_ids, txt_ids = _ids(args)
    # only linear layers are paired for localisation: both sides' blocks return their two streams in other orders
    linears = {n for n, mod in native.named_modules() if isinstance(mod, torch.nn.Linear)}
    pairs = {k: v for k, v in module_pairs(native, hf, parameter_sources(upstream.checkpoint, adapter.from_hf)).items()
             if k in linears}  # fmt: skip
    with OutputRecorder(native, list(pairs)) as nrec, OutputRecorder(hf, list(pairs.values())) as urec:
        native_loss, native_flow = native.loss(b.tokens, b.labels, **b.loss_kwargs())
        pred = native(noisy, timesteps=inp["timesteps"], text=inp["text"], pooled=inp["pooled"], guidance=inp.get("guidance"))
        theirs = hf(noisy, encoder_hidden_states=inp["text"], pooled_projections=inp["pooled"], timestep=inp["timesteps"],
                    img_ids=img_ids, txt_ids=txt_ids, guidance=inp.get("guidance"), return_dict=False)[0]  # fmt: skip
    their_loss = (theirs.float() - (inp["noise"] - b.tokens)).pow(2).mean()
    m.update(logits_rel_l2=rel_l2(pred, theirs), logits_max_abs=max_abs(pred, theirs))
    m.update(loss_abs_diff=abs(native_loss.item() - their_loss.item()), native_loss=native_loss.item(),
             upstream_loss=their_loss.item())  # fmt: skip
    # diffusers' flux adds no auxiliary term: the native loss must not either (its loss - flow loss is 0)
    aux = native_loss.item() - native_flow.item()
    m.update(aux_loss_abs_diff=abs(aux), native_aux_loss=aux, upstream_aux_loss=0.0)
    m.update(init_tensors_compared=0, init_tensors_differing=0)
    res["init"] = {"note": NO_UPSTREAM_INIT}
    rows = compare_outputs(nrec, urec, pairs)
    measured, record = divergence(rows, nrec, urec, pairs, criteria.threshold("logits_rel_l2"))
    m.update(measured)
    res["localisation"] = {**record, "note": "linear layers paired by their weights"}
    native.zero_grad(set_to_none=True)
    hf.zero_grad(set_to_none=True)
    native_loss.backward()
    their_loss.backward()
    grads = compare_grads(hf, native, adapter.to_hf, tokens=b.labels.numel())
    m.update(grad_max_rel_l2=grads.max_rel_l2, grad_worst_param=grads.worst_param)
    res["grads"] = grads.record()
    guidance = native.guidance_in
    used = guidance is not None and guidance.w1.weight.grad is not None and float(guidance.w1.weight.grad.norm()) > 0
    res["features"] = {"guidance": {"declared": args.guidance_embeds, "exercised": used,
                                    "how": "guidance scales in [1, 5] per sample; the embedder's gradient is not zero"}}  # fmt: skip
    m["features_exercised"] = used or not args.guidance_embeds
    m["features_idle"] = [] if m["features_exercised"] else ["guidance"]
    if args.guidance_embeds:
        m["feature_guidance"] = True
