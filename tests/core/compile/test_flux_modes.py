"""The flux family under the execution modes: every block compiles whole, and the Graph Trainer's
captured step is bit-identical to eager (loss and grad norm, every step)."""

import torch

from titan_core.compile.per_block import explain_blocks
from titan_core.config.loader import from_dict
from titan_core.models.registry import build_meta, resolve_args
from titan_core.train import run


ONE_OF_EACH = {"n_double_layers": 1, "n_single_layers": 1}
"""The debug model with one block of each kind (a flux block does not depend on its index): half its
blocks to trace and capture, every kind still there."""


def _cfg(out, **sections):
    d = {
        "model": {"family": "flux", "flavor": "debugmodel", "overrides": ONE_OF_EACH},
        "training": {"steps": 3, "batch_size": 2, "seq_len": 64, "seed": 0},
        "data": {"repeat_batch": True},
        "metrics": {"log_freq": 1, "rich": False, "output_dir": str(out)},
        "optimizer": {"lr": 1e-3},
    }
    for name, values in sections.items():
        d.setdefault(name, {}).update(values)
    return from_dict(d)


def test_every_flux_block_compiles_without_a_break():
    m = build_meta("flux", resolve_args("flux", "debugmodel", ONE_OF_EACH))
    m.to_empty(device="cpu")
    m.init_weights(seed=0)
    batch = m.args.own_samples(seed=0, batch_size=2, seq_len=64, repeat_batch=True)
    report = explain_blocks(m, batch.batch_at(0))
    assert len(report) == 2  # a double-stream and a single-stream block
    assert {path: (b.graphs, b.breaks) for path, b in report.items()} == {p: (1, 0) for p in report}


def test_graph_trainer_step_is_bit_identical_to_eager(tmp_path):
    eager = run(_cfg(tmp_path / "eager"), quiet=True)
    graph = run(_cfg(tmp_path / "graph", graph_trainer={"enable": True}), quiet=True)
    assert [(r["loss"], r["grad_norm"]) for r in graph.metrics] == [(r["loss"], r["grad_norm"]) for r in eager.metrics]
    losses = [r["loss"] for r in eager.metrics]
    assert losses[-1] < losses[0] and all(torch.isfinite(torch.tensor(losses)))
    assert eager.flops_per_token > 0 and eager.metrics[-1]["mfu"] > 0
