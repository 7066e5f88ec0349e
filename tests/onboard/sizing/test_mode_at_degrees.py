"""The execution mode the recipe earns is one titan_core runs at the recipe's own parallel degrees:
the rungs prove each mode at degree 1, and a mode titan_core refuses with the recipe's cp, ep or pp
is never a candidate (the recipe would not train)."""

from onboard.rungs.execution_mode import _only_mode, accepted_modes
from titan_core.config.sections import JobConfig, Parallelism
from titan_core.parallel.mesh import resolve_degrees, smallest_world

MODES = ["eager", "compile", "graph_trainer"]


def recipe(family="llama3", **degrees) -> JobConfig:
    cfg = JobConfig()
    cfg.model.family, cfg.model.flavor = family, "debugmodel"
    for k, v in degrees.items():
        setattr(cfg.parallelism, k, v)
    return cfg


def test_the_smallest_world_resolves_the_degrees():
    for p in (Parallelism(), Parallelism(ep=4), Parallelism(ep=4, cp=2), Parallelism(pp=2, tp=2, dp_shard=3),
              Parallelism(ep=2, cp=4), Parallelism(dp_replicate=2, ep=2)):  # fmt: skip
        world = smallest_world(p)
        d = resolve_degrees(p, world)  # raises when the world does not fit the degrees
        assert d.world_size == world and (d.dp_shard * d.cp) % d.ep == 0
    assert smallest_world(Parallelism(ep=4, cp=2)) == 4 and smallest_world(Parallelism()) == 1


def test_plain_degrees_refuse_no_mode():
    assert accepted_modes(recipe(), MODES) == (MODES, {})


def test_context_parallel_takes_every_mode():
    assert accepted_modes(recipe(cp=2), MODES) == (MODES, {})


def test_a_pipeline_refuses_the_graph_trainer_only():
    kept, refused = accepted_modes(recipe(pp=2, pp_schedule="gpipe"), MODES)
    assert kept == ["eager", "compile"] and list(refused) == ["graph_trainer"]
    assert "pp > 1 does not support graph_trainer.enable" in refused["graph_trainer"]


def test_expert_parallel_refuses_the_graph_trainer_only():
    kept, refused = accepted_modes(recipe("qwen3_moe", ep=2), MODES)
    assert kept == ["eager", "compile"] and list(refused) == ["graph_trainer"]


def test_degrees_refused_in_eager_too_are_not_the_modes_doing():
    # ep x tp with sequence parallel is refused whatever the mode: the simple_fsdp rung names that
    assert accepted_modes(recipe("qwen3_moe", ep=2, tp=2, sequence_parallel=True), MODES) == (MODES, {})


def test_the_only_mode_left_is_written_without_timing():
    cfg = recipe(pp=2, pp_schedule="gpipe")
    cfg.graph_trainer.enable = True
    edits, record = _only_mode("graph_trainer", cfg, "eager", "graph_trainer", {"graph_trainer": "refused (pp)"})
    assert [(e.key, e.value) for e in edits] == [("graph_trainer.enable", False)]
    assert record["execution_mode"] == "eager" and record["decisions"][0]["figure"] == "none"
    assert "only mode titan_core runs" in record["execution_mode_why"] and record["execution_mode_refused"]
