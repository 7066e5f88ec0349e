"""titan_core llama3 debugmodel vs HF LlamaForCausalLM of the same shape: eager fp32 train steps.

Speed is reported through titan_core.measure.timing: both models live in one process and
`compare(titan_step, hf_step)` steps them interleaved (A B B A ..., so machine noise hits
both alike) until the time ratio's interval is narrow enough; each sample is one step,
forward + cross-entropy + backward + AdamW. Prints JSON: the comparison (ratio = titan
time / HF time, with its interval and describe() line), each side's median step time and
tokens/s, the protocol's settings and the machine's load.

    python bench/trainer_vs_hf.py [--batch 8] [--seq 256] [--min-rounds N --max-rounds N]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

import _report  # noqa: E402
from titan_core.models import build_meta, get_family, resolve_args  # noqa: E402
from titan_core.measure.timing import compare, timed  # noqa: E402


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
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    _report.add_protocol_args(ap)
    opts = ap.parse_args()
    protocol = _report.protocol_from(opts)

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

    report = _report.start(
        "trainer_vs_hf", protocol, dtype="float32", threads=torch.get_num_threads(),
        shape={"dim": args.dim, "n_layers": args.n_layers, "n_heads": args.n_heads, "n_kv_heads": args.n_kv_heads,
               "vocab": args.vocab_size, "batch": opts.batch, "seq": opts.seq},
    )  # fmt: skip
    cmp = compare(timed(titan_step), timed(hf_step), protocol)
    tokens_per_step = opts.batch * opts.seq
    report.update(
        titan_step_s_median=cmp.candidate_median_s,
        hf_step_s_median=cmp.baseline_median_s,
        titan_tokens_per_s=tokens_per_step / cmp.candidate_median_s,
        hf_tokens_per_s=tokens_per_step / cmp.baseline_median_s,
    )
    report["comparisons"].append(_report.entry(cmp, "titan_core", "HF"))
    _report.emit(report)


if __name__ == "__main__":
    main()
