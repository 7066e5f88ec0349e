"""One parity run on a workspace: upstream HF vs native port, CPU fp32, same weights.

`check_workspace` is what the workspace's test_parity.py calls; it always writes the
results JSON (even when the port raises) so the rung can report what was measured.
"""

from __future__ import annotations

import copy
import math
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from titan_core.config import ConfigError
from titan_core.measure.numerics import max_abs, rel_l2, rounding_check, worst_unexcused
from titan_core.models.registry import get_family
from titan_core.models.transformers.adapter import predicted_vocab
from titan_core.config.hf_config import read_hf_config
from titan_core.models.transformers.hf_classes import config_object

from onboard.parity import criteria
from onboard.parity.compare import cap, compare_grads, round_trip
from onboard.parity import active_range, feature_pass, features
from onboard.parity import lora_parity
from onboard.upstream.init_check import compare_init, init_stats
from onboard.parity.localise import OutputRecorder, Row, compare_outputs, divergence, module_pairs, parameter_sources
from onboard.parity.native import (
    PortError, WorkspaceError, build_native, call_port, load_adapter, load_converted, native_args, native_hf_config,
    read_workspace,
)  # fmt: skip
from onboard.parity.diffusion import run_flow
from onboard.parity.results import results_path, write_results
from onboard.upstream.hf_model import build_upstream, seeded_init
from onboard.workspace.layout import HF_CONFIG, TWIN


def check_workspace(
    root: Path,
    *,
    weights_dir: Path | None = None,
    batch: int = 2,
    seq_len: int = 512,
    seed: int = 0,
    attn_implementation: str = "eager",
    out: Path | None = None,
) -> dict[str, Any]:
    """Run every parity comparison on the workspace at `root`, write and return the results.

    `results['error']` is None, or {'kind': 'bad_input' | 'port' | 'internal', 'message'}:
    bad input (no config, unknown model_type) is the user's to fix; a port error (the
    adapter or model.py raised) fails the gate like any other divergence; anything else is
    recorded and re-raised.
    """
    root = Path(root).resolve()
    started = time.perf_counter()
    m: dict[str, Any] = {"batch": batch, "seq_len": seq_len}
    res: dict[str, Any] = {"workspace": str(root), "measurements": m, "error": None, "versions": _versions()}
    try:
        _run(root, res, m, weights_dir, batch, seq_len, seed, attn_implementation)
    except PortError as e:
        res["error"] = {"kind": "port", "message": str(e)}
    except (ConfigError, WorkspaceError) as e:  # UpstreamError and the config reader's errors among them
        res["error"] = {"kind": "bad_input", "message": str(e)}
    except Exception as e:  # a bug here or upstream: recorded with what was measured, then raised
        res["error"] = {"kind": "internal", "message": f"{type(e).__name__}: {e}"}
        raise
    finally:
        res["seconds"] = round(time.perf_counter() - started, 3)
        write_results(out or results_path(root), res)
    return res


def _run(root, res, m, weights_dir, batch, seq_len, seed, attn_implementation) -> None:
    ws = read_workspace(root)
    cfg = native_hf_config(ws)
    res.update(model_type=cfg["model_type"], family=ws.family, path_kind=ws.path_kind)
    if ws.hf_config_path is not None and ws.hf_config_path.name == TWIN:
        res["model"] = f"twin ({TWIN})"
        if weights_dir is not None:  # the full model's tensors have the full model's shapes
            res["weights_note"] = (
                f"the weights in {weights_dir} are the full model's: the twin is compared on seeded weights, "
                "and the eager rung checked every checkpoint tensor's name, shape and dtype against the full model"
            )
            weights_dir = None
    m.update(lora_parity.disabled(ws.lora))  # "none" without [lora]: its criteria do not apply
    if get_family(ws.family).kind.upstream == "diffusers":
        lora_parity.refuse_diffusion(ws.lora)
        return run_flow(ws, cfg, res, m, root=root, weights_dir=weights_dir, batch=batch, seed=seed)
    params = criteria.params()
    upstream = build_upstream(cfg, weights_dir=weights_dir, seed=seed, attn_implementation=attn_implementation,
                              init_keep_below=int(params["init_min_elements"]))  # fmt: skip
    hf = upstream.model
    res.update(upstream_class=type(hf).__name__, weights=upstream.source, weights_check=upstream.loading)
    m.update(upstream.counts())
    adapter = load_adapter(root)
    if callable(getattr(adapter, "unconsumed_keys", None)):
        res["unconsumed_hf_keys"] = call_port(adapter.unconsumed_keys, "adapter.unconsumed_keys", cfg)
    # a seed the upstream init never uses: a native weight the adapter fails to load must not
    # start equal to its upstream counterpart by coincidence of generators (it did, seed for seed)
    native = build_native(ws, native_args(ws, adapter, cfg), seed=seed + 1000)
    _init_parity(res, m, upstream, native, adapter, cfg, seed, params)

    # 1. state dict: HF -> native (into the model) -> HF, exactly
    load = load_converted(native, call_port(adapter.from_hf, "adapter.from_hf", upstream.checkpoint))
    back = call_port(adapter.to_hf, "adapter.to_hf", native.state_dict())
    rt = round_trip(upstream.checkpoint, back)
    m.update(state_dict_same_keys=rt.same_keys, state_dict_max_abs_diff=rt.max_abs_diff)
    res["state_dict"] = rt.record(load)
    lora_parity.refuse_early(ws.lora, native, adapter)  # a [lora] the model cannot take: bad input, before the passes

    # 2. the inputs: long enough for every window, with pad ids when the config has one
    declared = features.declare(hf.config)
    active_range.declare_model(hf, declared)
    seq_len = features.seq_len_for(declared, seq_len, params)
    m["seq_len"] = seq_len
    vocab = predicted_vocab(hf.config.get_text_config())
    tokens, labels = features.make_inputs(vocab, batch, seq_len, seed, declared, params)
    features.record_static(declared, tokens, seq_len, params)
    sources = parameter_sources(upstream.checkpoint, lambda sd: call_port(adapter.from_hf, "adapter.from_hf", sd))
    pairs = module_pairs(native, hf, sources)

    # 3. logits, localisation, loss, gradients: on the given weights, then (when a declared
    # soft-cap or the routing stayed idle) on weights scaled so that every feature is active
    passes: list[dict[str, Any]] = []

    def compare(name: str, how: str | None = None) -> None:
        passes.append({"name": name, "how": how or "", "measurements": {}})
        try:
            _compare(passes[-1], hf, native, adapter, tokens, labels, pairs, declared, params)
        except PortError:  # keep what the passes measured before the port raised
            for p in passes:
                m.update({k: v for k, v in p["measurements"].items() if k not in m})
            raise

    compare("weights" if weights_dir is not None else "seeded")
    how = feature_pass.prepare_feature_pass(hf, declared, tokens, params, seed=seed)
    if how is not None:
        load_converted(native, call_port(adapter.from_hf, "adapter.from_hf", hf.state_dict()))
        compare("features", how)
    if ws.hf_config_path is not None and ws.hf_config_path.name == TWIN:
        # a feature the full model declares counts as exercised only where the twin holds it too
        full = read_hf_config(ws.hf_config_path.with_name(HF_CONFIG))
        features.not_held(declared, config_object(full), f"the twin ({TWIN})", hf.config)
    _combine(res, m, passes, declared)
    unreached = [] if ws.path_kind == "transformers" else (
        active_range.unreached_keys(hf.config, declared, res.get("unconsumed_hf_keys")))  # fmt: skip
    if unreached:
        m.update(features_exercised=False, features_idle=m["features_idle"] + unreached)

    # 4. the recipe's [lora] on copies of both models, which now hold the same weights, on inputs of its own
    lora_inputs = features.make_inputs(vocab, batch, seq_len, seed + lora_parity.SEED, declared, params)
    lora_m, res["lora"] = lora_parity.measure(ws.lora, native, hf, adapter, *lora_inputs, seed=seed)
    m.update(lora_m)


def _compare(record, hf, native, adapter, tokens, labels, pairs, declared, params) -> None:
    """One comparison of both models on `tokens` into `record`: measurements, localisation, gradients."""
    name, how, pm = record["name"], record["how"], record["measurements"]
    hf.zero_grad(set_to_none=True)
    native.zero_grad(set_to_none=True)
    # one upstream forward serves logits, localisation, the feature probes and the loss; the
    # native side runs forward (logits) and its own loss(), which may be a swapped kernel that must agree too
    with OutputRecorder(native, list(pairs)) as nrec, OutputRecorder(hf, list(pairs.values())) as urec:
        with torch.no_grad():
            native_logits = call_port(native, "native forward", tokens)
        with features.Probe(hf, declared) as probe:
            hf_out = hf(input_ids=tokens, use_cache=False)
            hf_logits = hf_out.logits
    features.record_probe(declared, probe, name, params, f" ({how})" if how else "")
    active_range.record_more(declared, probe, hf, name, params, f" ({how})" if how else "")
    # a features pass may scale the logits up to a soft-cap (30 and more); their rounding scales with
    # them, so the largest difference is read in units of their RMS where that is above 1
    scale = max(1.0, float(hf_logits.detach().double().pow(2).mean().sqrt()))
    raw = max_abs(native_logits, hf_logits)
    pm.update(logits_rel_l2=rel_l2(native_logits, hf_logits), logits_max_abs=raw / scale, logits_max_abs_raw=raw,
              logits_rms=scale)  # fmt: skip
    head = next((n for n, mod in hf.named_modules() if mod is hf.get_output_embeddings()), "lm_head")
    logits_row = Row("output", head, pm["logits_rel_l2"], raw, "final logits")
    rows = compare_outputs(nrec, urec, pairs) + [logits_row]
    loc = _localise(pm, rows, pairs, native, nrec, urec)

    # cross-entropy compared here and differentiated below; the MoE load-balancing term beside it
    native_loss, native_ce = call_port(native.loss, "native loss", tokens, labels)
    hf_ce = F.cross_entropy(hf_logits.flatten(0, 1).float(), labels.flatten())
    pm.update(
        loss_abs_diff=abs(native_ce.item() - hf_ce.item()),
        native_loss=native_ce.item(),
        upstream_loss=hf_ce.item(),
    )
    pm.update(_aux_parity(hf, hf_out, native_loss.item(), native_ce.item(), hf_ce.item()))
    native_ce.backward()
    hf_ce.backward()
    grads = compare_grads(
        hf, native, lambda sd: call_port(adapter.to_hf, "adapter.to_hf (gradients)", sd), tokens=labels.numel()
    )
    rounding = _fp64_check(hf, grads, tokens, labels, params)
    worst_judged, judged_err = worst_unexcused(grads.per_param, rounding)
    pm.update(grad_max_rel_l2=judged_err,
              grad_worst_param=worst_judged or grads.worst_param, grad_max_rel_l2_raw=grads.max_rel_l2,
              grads_excused_as_rounding=sum(bool(r.get("rounding")) for r in rounding.values()))  # fmt: skip
    grad_detail = {"fp64_check": rounding, **grads.record(),
                   "diagnosis": _embedding_diagnosis(hf, grads, tokens, declared)}  # fmt: skip
    record.update(localisation=loc, grads=grad_detail)


def _upstream_aux(hf, out) -> tuple[float, str]:
    """(upstream's weighted load-balancing term, how it was read): `router_aux_loss_coef * aux_loss`
    of the forward's output, which transformers adds to the loss when the config sets
    output_router_logits; 0.0 when the forward computed no aux_loss. NaN when it did but names
    no coefficient (nothing passes by being unmeasured)."""
    aux = getattr(out, "aux_loss", None)
    if aux is None:
        return 0.0, "upstream computed no aux_loss (no experts, or output_router_logits off): its term is 0"
    coef = getattr(hf, "router_aux_loss_coef", None)
    if coef is None:
        coef = getattr(hf.config.get_text_config(), "router_aux_loss_coef", None)
    if coef is None:
        return math.nan, "upstream computed an aux_loss but has no router_aux_loss_coef to weigh it with"
    aux = float(aux.detach())
    return float(coef) * aux, f"router_aux_loss_coef {coef!r} x aux_loss {aux!r}"


def _aux_parity(hf, out, native_loss: float, native_ce: float, hf_ce: float) -> dict[str, Any]:
    """The MoE load-balancing term, native against upstream, as each adds it to its training loss.

    The native term is read as its `loss - ce` (the model contract: `loss()` returns both), a
    difference of two fp32 numbers that carries up to half an fp32 ulp of the loss; so, as
    logits_max_abs does with large logits, the difference is read in units of the loss where that
    is above 1 (aux_loss_abs_diff; the plain one as aux_loss_abs_diff_raw)."""
    theirs, how = _upstream_aux(hf, out)
    ours = native_loss - native_ce
    raw = abs(ours - theirs) if math.isfinite(theirs) else math.nan
    return {
        "aux_loss_abs_diff": raw / max(1.0, abs(hf_ce)),
        "aux_loss_abs_diff_raw": raw,
        "native_aux_loss": ours,
        "upstream_aux_loss": theirs,
        "upstream_aux_how": how,
    }


def _init_parity(res, m, upstream, native, adapter, cfg, seed: int, params) -> None:
    """Init parity (init_check.py): the native model as its init_weights left it, mapped to HF names,
    against upstream's own init (taken before parity perturbs it; built again when weights were loaded)."""
    keep = int(params["init_min_elements"])
    theirs = upstream.init if upstream.init is not None else seeded_init(cfg, seed=seed, keep_below=keep)
    ours = init_stats(call_port(adapter.to_hf, "adapter.to_hf (init)", native.state_dict()), None, keep_below=keep)
    report = compare_init(ours, theirs, params)
    m.update(init_tensors_compared=report["init_tensors_compared"],
             init_tensors_differing=report["init_tensors_differing"])  # fmt: skip
    res["init"] = {"upstream": f"transformers' own init, seed={seed}", "native": f"init_weights(seed={seed + 1000})",
                   "differing": cap(report["differing"]), "not_judged": cap(report["not_judged"])}  # fmt: skip


def _fp64_check(hf, grads, tokens, labels, params) -> dict[str, dict]:
    """{param: numerics.rounding_check} for each gradient over the grad tolerance: the upstream model
    run once more in fp64 on the same batch, the native gradient (candidate) and the upstream fp32
    one (reference) both measured against it. {"error": why} under "" when fp64 cannot run (code
    that forces fp32 beside fp64 weights): then nothing is excused."""
    tol = criteria.threshold("grad_max_rel_l2")
    over = [n for n, e in grads.per_param.items() if not e <= tol and n in grads.mapped]
    if not over:
        return {}
    try:
        exact_model = copy.deepcopy(hf).double()
        can = getattr(exact_model, "_can_set_experts_implementation", None)
        if can and can():  # the per-expert loop: the grouped matmul takes no fp64
            exact_model.set_experts_implementation("eager")
        exact_model.zero_grad(set_to_none=True)
        logits = exact_model(input_ids=tokens, use_cache=False).logits
        F.cross_entropy(logits.flatten(0, 1).double(), labels.flatten()).backward()
        exact = dict(exact_model.named_parameters(remove_duplicate=False))
        theirs = dict(hf.named_parameters(remove_duplicate=False))
        factor = float(params["grad_rounding_factor"])
        return {n: rounding_check(grads.mapped[n], theirs[n].grad, exact[n].grad, factor) for n in over
                if exact[n].grad is not None and theirs[n].grad is not None}  # fmt: skip
    except Exception as e:  # noqa: BLE001 -- recorded; nothing is excused
        return {"": {"error": f"{type(e).__name__}: {e}"}}


WORST_OF = ("logits_rel_l2", "logits_max_abs", "loss_abs_diff", "aux_loss_abs_diff", "grad_max_rel_l2")


def _worst(values) -> float:
    return max(values, key=lambda v: math.inf if math.isnan(v) else v)


def _combine(res, m, passes: list[dict], declared) -> None:
    """The flat measurements the checklist evaluates: each comparison's worst over the passes."""
    first = passes[0]["measurements"]
    m.update({k: first[k] for k in ("native_loss", "upstream_loss", "modules_compared", "native_aux_loss",
                                    "upstream_aux_loss")})  # fmt: skip
    for key in WORST_OF:
        m[key] = _worst(p["measurements"][key] for p in passes)
    m["grad_max_rel_l2_raw"] = _worst(p["measurements"].get("grad_max_rel_l2_raw", p["measurements"]["grad_max_rel_l2"])
                                      for p in passes)  # fmt: skip
    m["grads_excused_as_rounding"] = sum(p["measurements"].get("grads_excused_as_rounding", 0) for p in passes)
    worst_grad = max(passes, key=lambda p: _worst([p["measurements"]["grad_max_rel_l2"]]))
    m["grad_worst_param"] = worst_grad["measurements"]["grad_worst_param"]
    res["grads"] = {**worst_grad["grads"], "pass": worst_grad["name"]}
    # localisation of the first pass that diverges (the seeded one when both do)
    shown = next((p for p in passes if p["measurements"]["first_divergence_module"]), passes[0])
    m.update({k: v for k, v in shown["measurements"].items() if k.startswith("first_divergence")})
    m["first_divergence_pass"] = shown["name"] if shown["measurements"]["first_divergence_module"] else None
    res["localisation"] = {**shown["localisation"], "pass": shown["name"]}
    res["passes"] = [{"name": p["name"], "how": p["how"], "measurements": p["measurements"]} for p in passes]
    res["features"] = {name: f.as_dict() for name, f in declared.items()}
    m["features_exercised"] = features.exercised(declared)
    m["features_idle"] = features.idle(declared)
    m["features_proved"] = active_range.feature_summary(declared)
    for name, f in declared.items():
        if f.declared:
            m[f"feature_{name}"] = f.value


def _embedding_diagnosis(hf, grads, tokens, declared) -> str | None:
    """Why the embedding's gradient differs, when the pad row is where it differs."""
    pad = declared["padding"]
    emb = hf.get_input_embeddings()
    if not pad.declared or emb.weight.grad is None:
        return None
    names = [n for n, p in hf.named_parameters(remove_duplicate=False) if p is emb.weight]
    name = next((n for n in names if n in grads.mapped), None)
    if name is None or grads.mapped[name].shape != emb.weight.shape:
        return None
    pad_id = pad.config["pad_token_id"]
    diff = grads.mapped[name].double() - emb.weight.grad.double()
    total, on_pad = float(diff.norm()), float(diff[pad_id].norm())
    if total == 0.0 or on_pad < 0.5 * total:  # most of the difference is elsewhere: not the padding row
        return None
    return (
        f"the gradient of {name} differs on the pad row (id {pad_id}; {int((tokens == pad_id).sum())} pad ids in the "
        f"batch): the upstream embedding has padding_idx={pad_id}, so the lookup gives that row no gradient; "
        f"build the native embedding with padding_idx = the config's pad_token_id ({pad_id})"
    )


def _localise(pm, rows: list[Row], pairs: dict[str, str], native, nrec, urec) -> dict[str, Any]:
    measured, record = divergence(rows, nrec, urec, pairs, criteria.threshold("logits_rel_l2"))
    pm.update(measured)
    with_params = {n for n, mod in native.named_modules() if n and any(True for _ in mod.parameters(recurse=False))}
    return {**record, "native_modules_without_upstream_match": cap(sorted(with_params - set(pairs) - {"output"}))}


def _versions() -> dict[str, str]:
    """torch's and the upstreams' versions (read from metadata: importing transformers or diffusers
    costs seconds a bad-input run need not pay)."""

    def of(package: str) -> str:
        try:
            return version(package)
        except PackageNotFoundError:
            return "not installed"

    return {"torch": torch.__version__, "transformers": of("transformers"), "diffusers": of("diffusers")}
