"""HF <-> native for Qwen3MoeForCausalLM.

Expert layouts (E experts, D = dim, I = moe_hidden_dim):
- native: experts.w1 / w3 [E, D, I] and w2 [E, I, D] (tokens @ w);
- HF in memory (transformers 5): mlp.experts.gate_up_proj [E, 2I, D] (gate_proj rows first)
  and mlp.experts.down_proj [E, D, I] (F.linear layout);
- HF on disk (published checkpoints): mlp.experts.{e}.(gate_proj|up_proj|down_proj).weight.
Conversions are transposes, splits and concatenations only, so HF -> native -> HF is
bit-exact. `to_hf` writes the in-memory layout; `from_hf` reads both.
"""

from __future__ import annotations

import re

import torch

from titan_core.models.common.hf_adapter import AdapterError, HFAdapter

ROUTER = ("moe.router.gate.weight", "mlp.gate.weight")
PER_EXPERT = re.compile(r"mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight")


def _t(x: torch.Tensor) -> torch.Tensor:
    # a fresh contiguous copy: views into another layout's storage break safetensors saving
    return x.transpose(-2, -1).contiguous()


class Qwen3MoeAdapter(HFAdapter):
    hf_model_types = ("qwen3_moe",)
    hf_architecture = "Qwen3MoeForCausalLM"

    # ---- state dicts ----------------------------------------------------------------
    def layer_group_to_hf(self, i, entries):
        entries = dict(entries)
        prefix = f"model.layers.{i}.mlp"
        out: dict[str, torch.Tensor] = {}
        if any(k.startswith("moe.shared_expert.") for k in entries):
            raise AdapterError("Qwen3MoeForCausalLM has no shared expert; this checkpoint has one")
        if ROUTER[0] in entries:
            out[f"{prefix}.gate.weight"] = entries.pop(ROUTER[0])
        experts = {k: entries.pop(f"moe.experts.{k}") for k in ("w1", "w2", "w3") if f"moe.experts.{k}" in entries}
        if experts:
            if len(experts) != 3:
                raise AdapterError(f"layer {i} has experts {sorted(experts)}; w1, w2 and w3 are needed together")
            out[f"{prefix}.experts.gate_up_proj"] = torch.cat((_t(experts["w1"]), _t(experts["w3"])), dim=1)
            out[f"{prefix}.experts.down_proj"] = _t(experts["w2"])
        out.update(super().layer_group_to_hf(i, entries))
        return out

    def layer_from_hf(self, i, entries, inverse):
        entries = dict(entries)
        out: dict[str, torch.Tensor] = {}
        if ROUTER[1] in entries:
            out[f"layers.{i}.{ROUTER[0]}"] = entries.pop(ROUTER[1])
        fused = {
            k: entries.pop(f"mlp.experts.{k}") for k in ("gate_up_proj", "down_proj") if f"mlp.experts.{k}" in entries
        }
        per_expert = {k: entries.pop(k) for k in list(entries) if PER_EXPERT.fullmatch(k)}
        if fused and per_expert:
            raise AdapterError(f"layer {i} holds experts both fused and per expert")
        if fused:
            out.update(self._from_fused(i, fused))
        elif per_expert:
            out.update(self._from_per_expert(i, per_expert))
        out.update(super().layer_from_hf(i, entries, inverse))
        return out

    @staticmethod
    def _from_fused(i, fused):
        if len(fused) != 2:
            raise AdapterError(f"layer {i}: mlp.experts needs gate_up_proj and down_proj, got {sorted(fused)}")
        gate_up, down = fused["gate_up_proj"], fused["down_proj"]
        hidden = gate_up.shape[1] // 2
        if gate_up.shape[1] != 2 * hidden or down.shape[2] != hidden:
            shapes = f"gate_up_proj {tuple(gate_up.shape)} and down_proj {tuple(down.shape)}"
            raise AdapterError(f"layer {i}: {shapes} disagree")
        return {
            f"layers.{i}.moe.experts.w1": _t(gate_up[:, :hidden]),
            f"layers.{i}.moe.experts.w3": _t(gate_up[:, hidden:]),
            f"layers.{i}.moe.experts.w2": _t(down),
        }

    @staticmethod
    def _from_per_expert(i, per_expert):
        by_kind: dict[str, dict[int, torch.Tensor]] = {"gate_proj": {}, "up_proj": {}, "down_proj": {}}
        for key, value in per_expert.items():
            m = PER_EXPERT.fullmatch(key)
            by_kind[m.group(2)][int(m.group(1))] = value
        n = max(max(d) for d in by_kind.values() if d) + 1
        for kind, d in by_kind.items():
            if sorted(d) != list(range(n)):
                raise AdapterError(f"layer {i}: {kind} present for experts {sorted(d)}, expected 0..{n - 1}")
        stack = {kind: torch.stack([d[e] for e in range(n)]) for kind, d in by_kind.items()}
        return {
            f"layers.{i}.moe.experts.w1": _t(stack["gate_proj"]),
            f"layers.{i}.moe.experts.w3": _t(stack["up_proj"]),
            f"layers.{i}.moe.experts.w2": _t(stack["down_proj"]),
        }

    # ---- configs --------------------------------------------------------------------
    def hf_names(self, cfg):
        return {
            **super().hf_names(cfg),
            "n_experts": "num_experts" if cfg.get("num_experts") is not None else "num_local_experts",
            "top_k": "num_experts_per_tok",
            "moe_hidden_dim": "moe_intermediate_size",
            "moe_every": "decoder_sparse_step",
            "dense_layers": "mlp_only_layers",
            "sliding_window": "sliding_window",
        }

    def extra_args_from_hf(self, cfg, take):
        # transformers 5 writes num_local_experts; published config.json files say num_experts
        n_experts = take("num_experts")
        local = take("num_local_experts")
        n_experts = n_experts if n_experts is not None else local
        if not n_experts:
            raise AdapterError("qwen3_moe config has no num_experts (or num_local_experts)")
        # Qwen3MoeForCausalLM adds router_aux_loss_coef * aux only when output_router_logits is set
        coef = take("router_aux_loss_coef", 0.001)
        with_aux = take("output_router_logits", False)
        # Qwen3-MoE in transformers 5 applies the window to every layer (no max_window_layers)
        use_window = take("use_sliding_window", False)
        window = take("sliding_window")
        take("max_window_layers")
        bias = take("attention_bias", False)
        return {
            "qk_norm": True,
            "qkv_bias": bias,
            "out_bias": bias,
            "sliding_window": window if use_window else None,
            "n_experts": n_experts,
            "top_k": take("num_experts_per_tok", 8),
            "moe_hidden_dim": take("moe_intermediate_size"),
            "norm_topk_prob": take("norm_topk_prob", False),
            "moe_every": take("decoder_sparse_step", 1),
            "dense_layers": list(take("mlp_only_layers") or []),
            "aux_loss_coef": float(coef) if with_aux else 0.0,
        }

    def hf_config(self, args):
        if args.shared_expert_hidden_dim:
            raise AdapterError("Qwen3MoeForCausalLM has no shared expert")
        if args.global_every:
            raise AdapterError("Qwen3-MoE windows every layer or none; a global-layer pattern cannot be exported")
        if args.qkv_bias != args.out_bias or not args.qk_norm:
            raise AdapterError("Qwen3-MoE has QK-norm and one attention_bias for q, k, v and o")
        cfg = super().hf_config(args)
        cfg.update(
            attention_bias=args.qkv_bias,
            use_sliding_window=bool(args.sliding_window),
            sliding_window=args.sliding_window,
            num_experts=args.n_experts,
            num_experts_per_tok=args.top_k,
            moe_intermediate_size=args.moe_hidden_dim,
            norm_topk_prob=args.norm_topk_prob,
            decoder_sparse_step=args.moe_every,
            mlp_only_layers=list(args.dense_layers),
            router_aux_loss_coef=args.aux_loss_coef,
            output_router_logits=args.aux_loss_coef > 0,
        )
        return cfg
