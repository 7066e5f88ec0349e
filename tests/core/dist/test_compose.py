"""The composition matrix (README, "Parallel degrees that compose"): every combination of
_compose_cases.COMBOS trained on gloo, one launch per world size (4 ranks where two degrees meet, in the
session's one 4-rank launch: _world.py; 8 where three do), against one plain process on the same rows:
every parameter's sharded init equal to the one-process init bit for bit, then fp32, 3 steps, every
step's loss and grad norm within the gates' fp32 bound; and each run built what it names (its mesh, its
pipeline stages, its compiled blocks). The combinations titan_core still refuses are checked at the end,
one line each, before anything is built.
"""

from __future__ import annotations

from pathlib import Path

import _world
import pytest
from _cases import max_rel, run_worker, tiny_cfg
from _compose_cases import COMBOS, combo_cfg, reference_cfg, world_of

from titan_core.config.loader import ConfigError
from titan_core.parallel import check_parallelism
from titan_core.parallel.mesh import smallest_world
from titan_core.training.trainer import Trainer

COMPOSE_REL = 1.0e-5
"""fp32 against one process: the same arithmetic, only the order of the sums (gathered keys, TP's partial
sums, the pipeline's stages, the gradient reductions) differs. The gates' fp32 bound of a parallel degree."""


_REFERENCES: dict[str, dict] = {}
"""One plain process per model, shared by the 4- and the 8-rank matrix."""


def _reference(model: str, out) -> dict:
    if model in _REFERENCES:
        return _REFERENCES[model]
    t = Trainer(reference_cfg(model, out / f"ref_{model}"), quiet=True)
    try:
        rows = []
        for _ in range(3):
            t.step += 1
            rows.append(t.train_step())
    finally:
        t.close()
    _REFERENCES[model] = {"loss": [r["loss"] for r in rows], "grad_norm": [r["grad_norm"] for r in rows]}
    return _REFERENCES[model]


WORKER = Path(__file__).with_name("_compose_worker.py")
JOB4 = _world.job("compose4", 4, WORKER, lambda root: ["4", str(root / "out")], __file__)


@pytest.mark.whole_machine  # its ranks meet at every collective: the background climbs pause
@pytest.mark.parametrize("world", [4, 8])
def test_every_combination_matches_one_process(request, tmp_path, world):
    names = [n for n in COMBOS if world_of(n) == world]
    if world == 4:  # in the session's one 4-rank launch (_world.py)
        ranks = _world.results(request, JOB4).ranks
    else:
        ranks = run_worker(str(world), world, tmp_path, worker=WORKER.name, timeout_s=420)
    refs = {m: _reference(m, tmp_path) for m in {COMBOS[n][0] for n in names}}
    for name in names:
        model, flags = COMBOS[name]
        p, got = combo_cfg(name, tmp_path).parallelism, ranks[0][name]
        # the sharded init (parallelised on meta, each rank's shards drawn) is the one-process init, bit for bit
        assert all(r[name]["init_compared"] > 0 and r[name]["init_unequal"] == [] for r in ranks), name
        for key in ("loss", "grad_norm"):
            err = max_rel(got[key], refs[model][key])
            assert err <= COMPOSE_REL, f"{name}: {key} {got[key]} vs one process {refs[model][key]} ({err:.2e})"
        # every rank logs the same global loss (the pipeline's too: the last stage's, shared)
        assert all(r[name]["loss"] == got["loss"] for r in ranks), name
        asked = {n: getattr(p, n) for n in ("pp", "dp_replicate", "dp_shard", "cp", "tp") if getattr(p, n) > 1}
        assert asked.items() <= got["mesh"].items(), (name, got["mesh"])
        assert (got["compiled"] > 0) == ("--compile.enable" in flags), name
        assert got["captured"] == ("--graph_trainer.enable" in flags), name
        assert got["ep_dispatch"] == ("--parallelism.ep=2" in flags), name  # the experts split, not just sharded
        if p.pp > 1:  # one stage per pp rank, every stage present in the world
            assert sorted({r[name]["stages"][0] for r in ranks}) == list(range(p.pp))
        if model == "tied4":  # the tied weight's copies (first and last stage, each on 2 dp ranks) equal after 3 steps
            held = [r[name]["embedding"] for r in ranks if r[name]["embedding"] is not None]
            assert len(held) == 4 and len(set(held)) == 1, name


REFUSED = {
    # flags: what the refusal names (README's table of combinations still refused, with the reasons)
    ("--parallelism.tp=2", "--parallelism.ep=2", "--parallelism.dp_shard=2", "--parallelism.sequence_parallel"):
        "the MoE layers run whole (replicated over tp)",
    ("--parallelism.ep=2", "--parallelism.dp_shard=2", "--graph_trainer.enable"): "one captured program",
    ("--parallelism.pp=2", "--parallelism.dp_shard=1", "--graph_trainer.enable"): "graph_trainer.enable",
}


@pytest.mark.parametrize("flags", list(REFUSED), ids=["_".join(f.split(".")[-1] for f in fl) for fl in REFUSED])
def test_still_refused_combinations_say_why_in_one_line(tmp_path, flags):
    family = "qwen3_moe" if "--parallelism.ep=2" in flags else "llama3"  # the MoE model where ep is asked
    cfg = tiny_cfg(family, tmp_path, *flags)
    with pytest.raises(ConfigError) as e:
        check_parallelism(cfg, smallest_world(cfg.parallelism))
    assert REFUSED[flags] in str(e.value) and "\n" not in str(e.value)
