"""What the ladder bought: the user's starting point, the eager baseline and the final recipe, side by side.

In one process, on the same data (the baseline's first micro-batch, repeated), each sample one
training step (forward, cross-entropy, backward, AdamW):

- `hf`: the upstream transformers model built from the workspace's config.json, in eager PyTorch
  (sdpa attention, fp32, AdamW and gradient clipping as transformers' Trainer does them), at the
  baseline's batch and thread count: what a user starts from;
- `baseline`: the workspace's recipe as the eager rung first ran it (eager mode, and every key a
  rung edited set back to its value before the first edit, from the ledger);
- `final`: the workspace's recipe.toml as the ladder left it (execution mode, kernels, tuned batch
  and flags; its first steps, compile or capture, run before timing).

Batches may differ (the tuning rung may have raised it), so every sample is seconds per token and
every ratio is of throughput. The pairs are timed interleaved by the one timing protocol
(titan_core.measure.timing.compare). Prints JSON: tokens/s of each, the ratios with their intervals, what
the baseline restored (and any key it could only assume), the protocol and the machine's load.

    python bench/ladder_speedup.py DEMO_DIR/onboarding/llama3_debug [--min-rounds N --max-rounds N --max-seconds S]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
from pathlib import Path

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

import _report  # noqa: E402
from titan_core.config.execution_modes import MODE_KEYS, execution_mode, set_execution_mode  # noqa: E402
from titan_core.measure.timing import compare, timed  # noqa: E402

SCHEDULED_STEPS = 10_000  # the timed rounds never run past the lr schedule


def value_before(entry: dict, key: str, edit: dict):
    """(value before this recipe edit, known) from what the editing rung recorded: the edit's own
    `before`, the tuning rung's untuned values, or the holder of the rung's Decision record of the
    key (the ledger's `details.decisions`, a list of onboard.ladder.decision.Decision records)."""
    if "before" in edit:
        return edit["before"], True
    if key in MODE_KEYS.values():
        return False, True  # the baseline is eager
    m, d = entry.get("measurements") or {}, entry.get("details") or {}
    if entry["rung"] == "tuning" and key in (m.get("untuned_values") or {}):
        return m["untuned_values"][key], True
    decisions = d.get("decisions")
    for record in decisions if isinstance(decisions, list) else ():
        if isinstance(record, dict) and record.get("lever") == key and "holder" in record:
            return record["holder"], True
    return None, False


def baseline_config(final, ledger: dict) -> tuple[object, dict, dict]:
    """(the eager baseline's config, {key: restored value}, {key: assumed default}) from the ledger's edits."""
    from titan_core.config.loader import get_key, with_keys
    from titan_core.config.sections import JobConfig

    restored, assumed = {}, {}
    for entry in ledger.get("attempts", []):  # oldest first: the first edit of a key saw its original value
        for edit in (entry.get("recipe_edit") or {}).get("edits", []):
            key = edit["key"]
            if key in restored or key in assumed:
                continue
            value, known = value_before(entry, key, edit)
            if known:
                restored[key] = value
            else:
                assumed[key] = get_key(JobConfig(), key)
    cfg = with_keys(final, {**restored, **assumed})
    set_execution_mode(cfg, "eager")
    return cfg, restored, assumed


def build_hf(ws_root: Path, recipe):
    """transformers' model for the workspace's config.json (the one config reader, as parity reads it), fp32, sdpa."""
    from transformers import AutoModelForCausalLM

    from onboard.upstream.hf_model import hf_config_object
    from titan_core.config.hf_config import read_hf_config

    config = hf_config_object(
        read_hf_config(Path(recipe.model.hf_config or ws_root / "config.json"), require_model_type=True)
    )
    torch.manual_seed(recipe.training.seed)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)


def trainer_of(cfg, out: Path):
    from titan_core.training.trainer import Trainer

    cfg = copy.deepcopy(cfg)
    cfg.training.steps = SCHEDULED_STEPS
    cfg.data.repeat_batch = True
    cfg.checkpoint.enable, cfg.profiler.enable = False, False
    cfg.metrics.output_dir = str(out)
    return Trainer(cfg, quiet=True)


def ratio_entry(c: dict) -> dict:
    """One pair's throughput ratio with its interval and outcome; a comparison the protocol did not measure
    (an interval not finite or too wide to say anything: titan_core.measure.timing) has neither."""
    interval = _report.speedup_interval(c)
    if interval is None or c["outcome"] == "not measured":
        return {"throughput": None, "interval": None, "outcome": "not measured", "rounds": c["rounds"]}
    return {"throughput": c["speedup"], "interval": interval, "outcome": c["outcome"], "rounds": c["rounds"]}


def tokens(cfg) -> int:
    t = cfg.training
    return t.batch_size * t.grad_accum * t.seq_len


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workspace", type=Path, help="a workspace folder (onboarding/NAME) the ladder finished")
    ap.add_argument("--out", default="", help="also write the JSON here")
    _report.add_protocol_args(ap)
    opts = ap.parse_args()
    protocol = _report.protocol_from(opts)

    import tempfile

    from onboard.rungs.train_run import process_threads
    from titan_core.runtime import distributed
    from titan_core.config import load_config

    root = opts.workspace.resolve()
    final_cfg = load_config(root / "recipe.toml")
    ledger_path = root / "ladder.json"
    ledger = json.loads(ledger_path.read_text()) if ledger_path.is_file() else {"attempts": []}
    base_cfg, restored, assumed = baseline_config(final_cfg, ledger)
    out = Path(tempfile.mkdtemp(prefix="ladder_speedup-"))
    threads = {"hf": base_cfg.device.threads, "baseline": base_cfg.device.threads, "final": final_cfg.device.threads}

    # the one-rank group both Trainers join: made here, so neither destroys it under the other
    state = None
    if final_cfg.parallelism.data_parallel != "none":
        state = distributed.init_distributed(torch.device("cpu"), final_cfg.parallelism.timeout_s)
    try:
        cfgs = {"baseline": base_cfg, "final": final_cfg}
        trainers = {name: trainer_of(cfg, out / name) for name, cfg in cfgs.items()}
        threads["final"] = trainers["final"].threads  # device.adapt_threads may have taken fewer
        batch = next(trainers["baseline"].data)  # its first micro-batch: repeat_batch yields it at every step
        hf = build_hf(root, final_cfg)
        opt = torch.optim.AdamW(hf.parameters(), lr=final_cfg.optimizer.lr, foreach=True)

        def hf_step():
            logits = hf(input_ids=batch.tokens).logits
            flat = logits.flatten(0, 1).float()
            loss = torch.nn.functional.cross_entropy(flat, batch.labels.flatten(), ignore_index=-100)
            loss.backward()
            # as transformers' Trainer does by default, and as the recipe does (its max_norm)
            torch.nn.utils.clip_grad_norm_(hf.parameters(), base_cfg.training.max_norm, foreach=True)
            opt.step()
            opt.zero_grad(set_to_none=True)

        hf_tokens = batch.tokens.numel()
        hf_timed = timed(hf_step)

        def sample(name):
            """One timing sample of `name`: a training step's seconds per token, with its thread count."""

            def step():
                with process_threads(threads[name]):
                    if name == "hf":
                        return hf_timed() / hf_tokens
                    return trainers[name].train_step()["step_time_s"] / tokens(cfgs[name])

            return step

        for name in ("baseline", "final"):  # compile / capture outside the timed rounds
            for _ in range(2):
                sample(name)()
        sample("hf")()
        report = _report.start(
            "ladder_speedup", protocol, workspace=str(root), cpu_count=os.cpu_count(), threads=threads,
            baseline={"restored": restored, "assumed_default": assumed, "tokens_per_step": tokens(base_cfg)},
            final={"tokens_per_step": tokens(final_cfg), "execution_mode": execution_mode(final_cfg),
                   "kernels": vars(final_cfg.kernels),
                   "batch_size": final_cfg.training.batch_size, "grad_accum": final_cfg.training.grad_accum},
            hf={"tokens_per_step": hf_tokens, "attn_implementation": "sdpa", "dtype": "float32"},
        )  # fmt: skip
        pooled: dict[str, list[float]] = {"hf": [], "baseline": [], "final": []}
        for cand, base in (("baseline", "hf"), ("final", "baseline"), ("final", "hf")):
            cmp = compare(sample(cand), sample(base), protocol)
            pooled[cand] += cmp.candidate_times_s
            pooled[base] += cmp.baseline_times_s
            report["comparisons"].append(_report.entry(cmp, cand, base, unit="seconds per token"))
            _report.progress(cmp.describe(cand, base) + " (per token)")
        # each side's median over all its timed samples; the ratios are the paired estimates, which a
        # machine whose load drifts between comparisons leaves trustworthy where these medians are not
        report["tokens_per_s"] = {name: 1 / statistics.median(times) for name, times in pooled.items()}
        report["ratios"] = {f"{c['candidate']}_vs_{c['baseline']}": ratio_entry(c) for c in report["comparisons"]}
    finally:
        distributed.teardown(state)
    _report.emit(report, opts.out)


if __name__ == "__main__":
    main()
