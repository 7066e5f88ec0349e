"""One rank of the 2-rank validation test: `python _validation_worker.py OUT CORPUS`.

Started by _world.launch (2 gloo ranks). For SimpleFSDP, FSDP2 (each rank half of
the global batch) and TP = 2 (both ranks the whole batch): the validation of the freshly built
model; SimpleFSDP then trains 3 steps validating at 2 and 3. Writes OUT/rank_<r>.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/core: held_out_data

import torch  # noqa: E402
from held_out_data import make_cfg  # noqa: E402

from titan_core.runtime import distributed  # noqa: E402
from titan_core.training.trainer import Trainer  # noqa: E402

MODES = {
    "simple_fsdp": (("--parallelism.data_parallel=simple_fsdp",), 1),
    "fsdp2": (("--parallelism.data_parallel=fsdp2",), 1),
    "tp": (("--parallelism.data_parallel=simple_fsdp", "--parallelism.tp=2", "--parallelism.dp_shard=1"), 2),
}
"""mode -> (overrides, per-rank batch size): the global batch is 2 rows in each."""


def _validate_all(out: Path, corpus: Path) -> dict:
    res = {}
    for mode, (extra, batch) in MODES.items():
        cfg = make_cfg(corpus, *extra, batch_size=batch, steps=3, freq=2, out=out / mode)
        t = Trainer(cfg, quiet=True)
        res[mode] = {"untrained": t.validator.run(t.model), "dp_world": t.dp_world, "mode": t.degrees.mode}
        if mode == "simple_fsdp":
            rows = t.train().metrics
            res[mode]["rows"] = [{k: r.get(k) for k in ("step", "loss", "val_loss", "val_tokens")} for r in rows]
    return res


def main(out: Path, corpus: Path) -> None:
    # one process group for every trainer (each would otherwise create and tear down its own)
    with distributed.process_group(torch.device("cpu"), timeout_s=120) as state:
        res = _validate_all(out, corpus)
    (out / f"rank_{state.rank}.json").write_text(json.dumps(res))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
