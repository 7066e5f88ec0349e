"""titan_core llama3 debugmodel vs HF LlamaForCausalLM of the same shape: eager fp32 train steps.

Both models live in one process and are stepped alternately (so machine noise hits both
alike); each step is forward + cross-entropy + backward + AdamW. Prints JSON:
{"titan_tokens_per_s", "hf_tokens_per_s", "ratio", ...} with ratio = titan / hf.

    python bench/trainer_vs_hf.py [--steps 20] [--warmup 3] [--batch 8] [--seq 256]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from titan_core.models import build_meta, get_family, resolve_args  # noqa: E402


def build_titan(args):
    model = build_meta("llama3", args)
    model.to_empty(device="cpu")
    model.init_weights(seed=0)
    return model


def build_hf(args):
    import transformers

    cfg_dict = get_family("llama3").adapter.hf_config(args)
    cfg = transformers.LlamaConfig(**{k: v for k, v in cfg_dict.items() if k not in ("model_type", "architectures")})
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    opts = ap.parse_args()

    args = resolve_args("llama3", "debugmodel")
    titan, hf = build_titan(args), build_hf(args)
    opt_t = torch.optim.AdamW(titan.parameters(), lr=1e-4)
    opt_h = torch.optim.AdamW(hf.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, args.vocab_size, (opts.batch, opts.seq + 1), generator=gen)
    inputs, labels = tokens[:, :-1], tokens[:, 1:]

    def titan_step():
        loss, _ = titan.loss(inputs, labels)
        loss.backward()
        opt_t.step()
        opt_t.zero_grad(set_to_none=True)

    def hf_step():
        logits = hf(input_ids=inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        loss.backward()
        opt_h.step()
        opt_h.zero_grad(set_to_none=True)

    times: dict[str, list[float]] = {"titan": [], "hf": []}
    for i in range(opts.warmup + opts.steps):
        order = [("titan", titan_step), ("hf", hf_step)]
        if i % 2:
            order.reverse()
        for name, fn in order:
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            if i >= opts.warmup:
                times[name].append(dt)
    tokens_per_step = opts.batch * opts.seq
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {
        "benchmark": "trainer_vs_hf",
        "shape": {"dim": args.dim, "n_layers": args.n_layers, "n_heads": args.n_heads, "n_kv_heads": args.n_kv_heads,
                  "vocab": args.vocab_size, "batch": opts.batch, "seq": opts.seq},
        "dtype": "float32",
        "threads": torch.get_num_threads(),
        "timed_steps": opts.steps,
        "titan_step_s_median": med["titan"],
        "hf_step_s_median": med["hf"],
        "titan_tokens_per_s": tokens_per_step / med["titan"],
        "hf_tokens_per_s": tokens_per_step / med["hf"],
        "ratio": med["hf"] / med["titan"],
    }  # fmt: skip
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
