"""One rank of the transformers-path sharding test: `python _transformers_fsdp_worker.py OUT CONFIG_JSON`.

Started by _world.launch (2 gloo ranks). Trains the tiny transformers llama under
SimpleFSDP and under FSDP2 on this rank's half of the global batch; writes OUT/rank_<r>.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402
from _cases import GLOBAL_BATCH, curve, tiny_cfg  # noqa: E402
from torch.distributed.fsdp import FSDPModule  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

from titan_core.runtime import distributed  # noqa: E402
from titan_core.training.trainer import Trainer  # noqa: E402


def tf_cfg(out: Path, hf_config: str, *extra: str, batch_size: int = GLOBAL_BATCH, steps: int = 3):
    """The tiny transformers llama of `hf_config` (tiny_cfg's training settings, no overrides)."""
    cfg = tiny_cfg("llama3", out, "--model.family=transformers", f"--model.hf_config={hf_config}", *extra,
                   batch_size=batch_size, steps=steps)  # fmt: skip
    cfg.model.overrides = {}
    return cfg


def main(out: Path, hf_config: str) -> None:
    # one process group for both trainers (each would otherwise create and tear down its own)
    with distributed.process_group(torch.device("cpu"), timeout_s=120) as state:
        res = _train_both(out, hf_config)
    (out / f"rank_{state.rank}.json").write_text(json.dumps(res))


def _train_both(out: Path, hf_config: str) -> dict:
    res = {}
    for mode in ("simple_fsdp", "fsdp2"):
        t = Trainer(
            tf_cfg(out / mode, hf_config, f"--parallelism.data_parallel={mode}", batch_size=GLOBAL_BATCH // 2),
            quiet=True,
        )
        blocks = list(t.model.model.layers)
        sharded = {n: isinstance(p, DTensor) for n, p in t.model.named_parameters()}
        r = t.train()
        res[mode] = {
            **curve(r.metrics),
            "world_size": r.world_size,
            "all_params_sharded": all(sharded.values()) and len(sharded) > 0,
            "block_params": sum(n.startswith("model.layers.") for n in sharded),
            # FSDP2: one unit per decoder layer (plus the root), SimpleFSDP: gathering classes
            "block_classes": sorted({type(b).__name__ for b in blocks}),
            "blocks_are_fsdp_units": all(isinstance(b, FSDPModule) for b in blocks),
        }
    return res


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
