"""One rank of the initial_hf / export test at world size 2: `python _hf_weights_worker.py OUT CKPT`.

Started by _world.launch (2 gloo ranks). Loads the tiny Llama in CKPT through
checkpoint.initial_hf under SimpleFSDP, recording every read safetensors serves this rank (a
slice's ranges, or a whole tensor), trains 3 steps, exports in 1 MB shards, takes 10 greedy
tokens from the sharded model and streams its weights into a transformers model (`stream_into_transformers`); then one step from the same load under FSDP2, tensor parallel and
two pipeline stages. Writes OUT/rank_<r>.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))  # tests/core: hf_tiny

import torch  # noqa: E402
from _stream_peak import stream_peak  # noqa: E402
from hf_tiny import tiny_cfg, titan_greedy  # noqa: E402

from titan_core.models.model_builder import model_adapter  # noqa: E402
from titan_core.runtime import distributed  # noqa: E402
from titan_core.training import hf_load  # noqa: E402
from titan_core.training.trainer import Trainer  # noqa: E402
from titan_core.weights.hf_stream import hf_weights  # noqa: E402


class _Recorded:
    """A safetensors file whose reads are recorded: (name, [[start, stop] per dim] or None for whole, bytes)."""

    def __init__(self, f, reads: list):
        self.f, self.reads = f, reads

    def __enter__(self):
        self.f.__enter__()
        return self

    def __exit__(self, *exc):
        return self.f.__exit__(*exc)

    def get_tensor(self, name):
        t = self.f.get_tensor(name)
        self.reads.append((name, None, t.numel() * t.element_size()))
        return t

    def get_slice(self, name):
        sliced, reads = self.f.get_slice(name), self.reads

        class Slice:
            def get_shape(self):
                return sliced.get_shape()

            def __getitem__(self, idx):
                t = sliced[idx]
                reads.append((name, [[s.start, s.stop] for s in idx], t.numel() * t.element_size()))
                return t

        return Slice()


def stream_into_transformers(trainer: Trainer, export: Path) -> dict:
    """The trained model's HF weight stream (titan_core/weights/hf_stream.py) on this rank, copied in place into a
    transformers model built from the export's config.json (its own random init), as an inference engine's
    `load_weights` would, counted as _stream_peak.py does (nothing kept: the peak is the stream's own); then that
    model's logits against those of the export loaded by from_pretrained, on the same tokens."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(export)
    torch.manual_seed(1)
    engine = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    params = engine.state_dict()
    took = stream_peak(hf_weights(trainer.model, model_adapter(trainer.cfg.model)),
                       lambda name, tensor: params[name].copy_(tensor))
    exported = transformers.AutoModelForCausalLM.from_pretrained(export).float().eval()
    tokens = torch.tensor([[1, 5, 9, 2, 7, 3, 11, 4]])
    with torch.no_grad():
        mine, theirs = engine(tokens).logits, exported(tokens).logits
    return {"names": took["names"], "peak_bytes": took["peak_bytes"], "largest_bytes": took["largest_bytes"],
            "logits_equal": bool(torch.equal(mine, theirs)), "missing": sorted(set(params) - set(took["names"]))}  # fmt: skip


def main(out: Path, ckpt: Path) -> None:
    reads: list = []
    real_open = hf_load._open
    hf_load._open = lambda path: _Recorded(real_open(path), reads)
    with distributed.process_group(torch.device("cpu"), timeout_s=120) as state:
        cfg = tiny_cfg(ckpt, out / "run", "--parallelism.data_parallel=simple_fsdp", "--checkpoint.export_hf=export",
                       "--checkpoint.export_shard_mb=1", steps=3, batch_size=1)  # fmt: skip
        trainer = Trainer(cfg, quiet=True)
        result = trainer.train()
        greedy = titan_greedy(trainer.model)  # every rank: each forward gathers the shards
        stream = stream_into_transformers(trainer, out / "run" / "export")
        res = {
            "world_size": result.world_size,
            "loss": [r["loss"] for r in result.metrics],
            "weights_from": result.weights_from,
            "reads": reads,
            "greedy": greedy,
            "export": str(out / "run" / "export"),
            "stream": stream,
        }
        hf_load._open = real_open
        modes = {"fsdp2": ["--parallelism.data_parallel=fsdp2"],
                 "tp": ["--parallelism.data_parallel=simple_fsdp", "--parallelism.tp=2"],
                 "pp": ["--parallelism.data_parallel=simple_fsdp", "--parallelism.pp=2", "--parallelism.dp_shard=1",
                        "--training.grad_accum=2"]}  # fmt: skip
        for name, extra in modes.items():
            # TP ranks share their rows: the one data-parallel rank takes both; pp's two stages, both rows as
            # two micro-batches of one
            batch = 2 if name == "tp" else 1
            t = Trainer(tiny_cfg(ckpt, out / name, *extra, batch_size=batch), quiet=True)
            res[name] = {"loss": t.train().metrics[0]["loss"], "weights_from": t.weights_from}
    (out / f"rank_{state.rank}.json").write_text(json.dumps(res))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
