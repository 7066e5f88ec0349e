"""One rank of the [lora] tests at world size 2 (dp_tp_sp: 4): `python _lora_worker.py MODE OUT CKPT`.

The tiny Llama checkpoint CKPT (hf_tiny.py) loaded through checkpoint.initial_hf, adapters on q_proj,
v_proj and down_proj and lm_head saved whole, under SimpleFSDP over 2 ranks, 4 steps of 2 rows per rank,
a DCP checkpoint at step 2. MODE:
- full: the run uninterrupted (started by _world.py's shared launch); records its curve, which
  parameters hold a gradient and optimizer state after the last step, the merged weight stream
  (titan_core/lora/stream.py) into OUT/full/stream_<r>.pt and its peak, its PEFT export
  (checkpoint.export_hf) OUT/full/adapter and its merged export OUT/full/merged;
- killed: the same run in OUT/run, rank 1 killing itself with SIGKILL as step 3 starts (after step 2's
  checkpoint), as `kill -9` or the out-of-memory killer would;
- resumed: the same run in OUT/run again, from that checkpoint;
- fsdp2: the full run's records under FSDP2 in OUT/fsdp2, without the saved head (FSDP2 refuses it);
- graph: the full run's 4 steps as the Graph Trainer's captured step, in OUT/graph;
- tp, tp_sp, dp_tp_sp: the full run's records under tensor parallelism in OUT/<mode> (test_lora_tp.py):
  tp = 2 on 2 ranks (tp_sp: with sequence parallel), or dp 2 x tp 2 with sequence parallel on 4 ranks;
  each rank reads the rows of its dp rank (TP = MODES).
Writes OUT/rank_<r>.json (killed: nothing, it dies).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402
from _cases import CKPT, GLOBAL_BATCH, curve  # noqa: E402
from _stream_peak import stream_peak  # noqa: E402
from hf_tiny import tiny_cfg  # noqa: E402

from titan_core.lora.stream import lora_weights  # noqa: E402
from titan_core.models.model_builder import model_adapter  # noqa: E402
from titan_core.runtime import distributed  # noqa: E402
from titan_core.training.lora_export import export_lora  # noqa: E402
from titan_core.training.trainer import Trainer  # noqa: E402

LORA = ("--lora.enable", "--lora.target_modules=q_proj,v_proj,down_proj")
SAVED = "--lora.modules_to_save=lm_head"
STEPS = 4
KILL_AT = 3
"""The step rank 1 dies in: the last checkpoint is step 2's (CKPT: every 2 steps)."""
STREAM_REL = 1e-5
"""The merged stream after 4 steps vs one process's: the weights carry the curves' fp32 reduction-order noise."""
SP = "--parallelism.sequence_parallel"
TP = {"tp": ("--parallelism.tp=2",), "tp_sp": ("--parallelism.tp=2", SP), "dp_tp_sp": ("--parallelism.tp=2", SP)}
"""The tensor-parallel modes' flags; dp is what the world leaves (dp_tp_sp: 4 ranks, dp 2)."""
RECORDED = ("full", "fsdp2", *TP)
"""The modes that record everything: curve, what trains, the merged stream and both exports."""


def lora_cfg(ckpt: Path, out: Path, *extra: str, batch_size: int = 2, saved: bool = True):
    return tiny_cfg(ckpt, out, *LORA, *([SAVED] if saved else []), *CKPT, *extra, batch_size=batch_size, steps=STEPS)


def held(trainer: Trainer) -> dict:
    """The parameters holding a gradient, those holding optimizer state, and each trainable one's placements."""
    params = dict(trainer.model.named_parameters())
    state = trainer.optimizer.state
    return {"grads": sorted(n for n, p in params.items() if p.grad is not None),
            "optim": sorted(n for n, p in params.items() if p in state and state[p]),
            "placements": {n: [str(x) for x in p.placements] if isinstance(p, DTensor) else None
                           for n, p in params.items() if p.requires_grad}}  # fmt: skip


def stream(trainer: Trainer) -> dict[str, torch.Tensor]:
    adapter = model_adapter(trainer.cfg.model)
    return {n: t.clone() for n, t in lora_weights(trainer.model, trainer.lora, adapter, merged=True)}


def merged_stream_peak(trainer: Trainer) -> dict:
    """The merged stream driven as an engine's `load_weights` would take it (_stream_peak.py), nothing kept."""
    adapter = model_adapter(trainer.cfg.model)
    out = stream_peak(lora_weights(trainer.model, trainer.lora, adapter, merged=True))
    return {k: out[k] for k in ("peak_bytes", "largest_bytes", "total_bytes")}


def main(mode: str, out: Path, ckpt: Path) -> None:
    with distributed.process_group(torch.device("cpu"), timeout_s=120) as state:
        folder = mode if mode in (*RECORDED, "graph") else "run"
        export = [f"--checkpoint.export_hf={out / folder / 'adapter'}"] if mode in RECORDED else []
        dp = "fsdp2" if mode == "fsdp2" else "simple_fsdp"
        extra = [*TP.get(mode, ()), *(["--graph_trainer.enable"] if mode == "graph" else [])]
        dp_world = state.world_size // 2 if mode in TP else state.world_size
        cfg = lora_cfg(ckpt, out / folder, f"--parallelism.data_parallel={dp}", *export, *extra,
                       batch_size=GLOBAL_BATCH // dp_world, saved=mode != "fsdp2")  # fmt: skip
        trainer = Trainer(cfg, quiet=True)
        if mode == "killed" and state.rank == 1:
            launch = trainer._launch

            def dying():
                if trainer.step == KILL_AT:
                    os.kill(os.getpid(), signal.SIGKILL)
                return launch()

            trainer._launch = dying
        result = trainer.train()
        res = {"world_size": result.world_size, "resumed_from": result.resumed_from,
               "weights_from": result.weights_from, "steps": [r["step"] for r in result.metrics],
               "captured": trainer.graph_step is not None,
               **curve(result.metrics)}  # fmt: skip
        if mode in RECORDED:
            res |= held(trainer) | {"stream_peak": merged_stream_peak(trainer)}
            torch.save(stream(trainer), out / folder / f"stream_{state.rank}.pt")
            export_lora(trainer.model, trainer.lora, cfg, trainer.family, trainer.args, out / folder / "merged",
                        merged=True)  # fmt: skip
    (out / f"rank_{state.rank}.json").write_text(json.dumps(res))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))
