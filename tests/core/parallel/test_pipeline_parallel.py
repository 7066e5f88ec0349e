"""Pipeline parallelism (titan_core/parallel/pipeline.py, titan_core/training/pipeline_step.py).

Unit (no processes): the layer split, the stage placement, the stages' weights against the whole
model's initialisation, the stages chained against the whole model's loss, the refusals. On gloo, each
in the session's one launch of its world size (tests/core/dist/_world.py): pp = 2 on 2 ranks for each
case of _pp_cases.TWO_RANKS (gpipe, 1F1B, interleaved1F1B, pp_layers = [1, 3], packed documents, MoE),
and pp = 2 x dp_shard = 2 and pp = 2 x dp_replicate = 2 on 4 ranks; each against one plain process
(pp = 1) with the same grad_accum over the same rows: every step's loss and grad norm, and every
parameter after the last step.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from _pp_cases import BATCH, CASES, COMMON, FOUR_RANKS, GRAD_ACCUM, STEPS, TWO_RANKS, case_cfg, corpus_at

from titan_core.config.loader import ConfigError
from titan_core.measure.numerics import curve_max_rel, rel_l2
from titan_core.models import build_meta, resolve_args
from titan_core.parallel import check_parallelism
from titan_core.parallel.pipeline import (
    DecoderStage,
    check_pipeline_model,
    cut_stages,
    local_stages,
    stage_layer_counts,
    stage_layer_ids,
)
from titan_core.training.trainer import Trainer

sys.path.insert(0, str(Path(__file__).parents[1] / "dist"))  # _world: the session's one launch per world size
import _world  # noqa: E402

PP_REL = 1.0e-5
"""fp32, pp = 2 vs pp = 1 with the same micro-batches: the same ops in the same order; only the grad
norm's sum over stages (and, with dp_shard = 2, the gradient reduce) rounds differently."""

DP_PARAM_REL = 5.0e-5
"""Parameters after 3 steps with dp_shard = 2: the data-parallel gradient reduce rounds differently from one
process, and AdamW's first steps (an update near lr x sign(grad)) magnify that on tiny gradients. Measured:
1.9e-5 worst (layers.0.attention.wo), the same per parameter for pp = 1 x dp_shard = 2 as for pp = 2 x dp_shard = 2
(and for dp_replicate = 2)."""

WORKER = Path(__file__).with_name("_pp_worker.py")
TINY = {"n_layers": 4, "dim": 64, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "ffn_hidden_dim": 128,
        "vocab_size": 256}  # fmt: skip


# ---- unit: no processes ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n_layers, stages, given, want",
    [(4, 2, [], [2, 2]), (5, 2, [], [3, 2]), (7, 3, [], [3, 2, 2]), (4, 4, [], [1, 1, 1, 1]),
     (4, 2, [1, 3], [1, 3]), (4, 2, ["3", "1"], [3, 1])],  # fmt: skip
)
def test_layer_split(n_layers, stages, given, want):
    counts = stage_layer_counts(n_layers, stages, given)
    assert counts == want
    ids = stage_layer_ids([str(i) for i in range(n_layers)], counts)
    assert [int(k) for s in ids for k in s] == list(range(n_layers))  # every layer once, in order
    assert [len(s) for s in ids] == want


def test_stage_placement_is_round_robin():
    assert local_stages(0, 2, 2) == [0] and local_stages(1, 2, 2) == [1]
    assert local_stages(0, 2, 4) == [0, 2] and local_stages(1, 2, 4) == [1, 3]


@pytest.mark.parametrize(
    "given, match",
    [([1, 2], "sums to 3, but the model has 4 layers"), ([1, 1, 2], "must hold 2 whole numbers"),
     ([0, 4], "must hold 2 whole numbers"), (["a", "4"], "must hold 2 whole numbers"), ([], None)],  # fmt: skip
)
def test_layer_split_refusals(given, match):
    if match is None:  # more stages than layers
        with pytest.raises(ConfigError, match="4 pipeline stages need at least one layer each, but the model has 3"):
            stage_layer_counts(3, 4, given)
        return
    with pytest.raises(ConfigError, match=rf"parallelism\.pp_layers.*{match}"):
        stage_layer_counts(4, 2, given)


@pytest.mark.parametrize("layers, first, last", [(["0"], True, False), (["1", "2", "3"], False, True),
                                                 (["0", "2"], True, False), (["1", "3"], False, True)])  # fmt: skip
def test_stage_weights_are_the_whole_models_and_nothing_else(layers, first, last):
    args = resolve_args("llama3", "debugmodel", TINY)
    whole = build_meta("llama3", args)
    whole.to_empty(device="cpu")
    whole.init_weights(seed=3)
    want = dict(whole.named_parameters())
    model = build_meta("llama3", args)
    record = cut_stages(model, layers, first=first, last=last, device="cpu", seed=3, dtype=torch.float32, mesh=None)
    got = dict(model.named_parameters())
    assert list(model.layers.keys()) == layers
    assert (model.tok_embeddings is not None) == first
    assert (model.norm is not None) == (model.output is not None) == last
    owned = {k for k in want if k.split(".")[0] != "layers" or k.split(".")[1] in layers}
    owned = {k for k in owned if not k.startswith("tok_embeddings") or first}
    owned = {k for k in owned if not k.startswith(("norm.", "output.")) or last}
    assert set(got) == owned
    for k in got:
        assert torch.equal(got[k], want[k]), k  # the same draw as the whole model's, bit for bit
    assert all(p.device.type == "cpu" for p in model.parameters())
    # the other stages were drawn one module at a time, never held together
    assert record.peak_full_bytes <= record.budget_bytes == max(
        sum(p.numel() * 4 for p in m.parameters(recurse=False)) for m in whole.modules()
    )


def test_stages_chained_compute_the_whole_models_loss():
    """Two stages fed one into the other give the whole model's cross-entropy, with packed documents."""
    args = resolve_args("llama3", "debugmodel", TINY)
    whole = build_meta("llama3", args)
    whole.to_empty(device="cpu")
    whole.init_weights(seed=5)
    g = torch.Generator().manual_seed(11)
    tokens = torch.randint(0, 256, (2, 16), generator=g)
    labels = torch.randint(0, 256, (2, 16), generator=g)
    segments = torch.tensor([[0] * 6 + [1] * 10, [0] * 16])
    positions = torch.cat([torch.arange(6), torch.arange(10)]).expand(2, -1).clone()
    positions[1] = torch.arange(16)
    _, want = whole.loss(tokens, labels, positions=positions, segment_ids=segments)
    parts = [build_meta("llama3", args) for _ in range(2)]
    for i, (part, ids) in enumerate(zip(parts, (["0", "1", "2"], ["3"]))):
        cut_stages(part, ids, first=i == 0, last=i == 1, device="cpu", seed=5, dtype=torch.float32, mesh=None)
    s0 = DecoderStage(parts[0], ["0", "1", "2"], first=True, last=False)
    s1 = DecoderStage(parts[1], ["3"], first=False, last=True)
    h = s0(tokens, positions=positions, segment_ids=segments)
    got = s1.cross_entropy(s1(h, positions=positions, segment_ids=segments), labels)
    assert rel_l2(got, want) <= 1e-6
    unpacked = s1.cross_entropy(s1(s0(tokens)), labels)  # the positions matter: a check that could fail
    assert rel_l2(unpacked, want) > 1e-4


def _cfg(tmp_path, *extra: str, dp_shard: int = 1):
    return case_cfg("1F1B", tmp_path, tmp_path / "out", "--parallelism.pp=2", f"--parallelism.dp_shard={dp_shard}",
                    *extra)  # fmt: skip


@pytest.mark.parametrize(
    "extra, world, match",
    [
        (("--training.grad_accum=1",), 2,
         r"training\.grad_accum = 1 micro-batches: pp_schedule 1F1B needs at least pp = 2"),
        (("--training.grad_accum=5", "--parallelism.pp_schedule=interleaved1F1B"), 2,
         r"training\.grad_accum = 5 micro-batches: pp_schedule interleaved1F1B needs"),
        (("--parallelism.pp_layers=1,2",), 2, r"parallelism\.pp_layers = \[1, 2\] sums to 3, but the model has 4"),
        (("--parallelism.pp_layers=1,1,2",), 2, r"parallelism\.pp_layers .* must hold 2 whole numbers"),
        (("--parallelism.pp_schedule=interleaved1F1B", "--model.overrides={n_layers = 3}"), 2,
         r"4 pipeline stages need at least one layer each, but the model has 3"),
        (("--parallelism.data_parallel=fsdp2",), 2,
         r"parallelism\.pp = 2 needs data_parallel = 'simple_fsdp', not 'fsdp2'"),
        (("--parallelism.data_parallel=none",), 2, r"needs data_parallel = 'simple_fsdp', not 'none'"),
        (("--graph_trainer.enable",), 2, r"does not support graph_trainer\.enable"),
        (("--checkpoint.export_hf=hf",), 2, r"does not support checkpoint\.export_hf"),
        (("--model.module_file=model.py",), 2, r"does not support model\.module_file"),
    ],
)
def test_refusals(tmp_path, extra, world, match):
    with pytest.raises(ConfigError, match=match) as e:
        check_parallelism(_cfg(tmp_path, *extra), world)
    assert "\n" not in str(e.value)


def test_accepted_configs(tmp_path):
    assert check_parallelism(_cfg(tmp_path), 2).pp == 2
    assert check_parallelism(_cfg(tmp_path, "--training.grad_accum=3",
                                  "--parallelism.pp_schedule=interleaved1F1B"), 2).pp == 2  # fmt: skip
    assert check_parallelism(_cfg(tmp_path, "--training.grad_accum=1", "--parallelism.pp_schedule=gpipe"), 2).pp == 2
    with pytest.raises(ConfigError, match=r"pp_layers = \['1', '3'\] splits pipeline stages: it needs pp > 1"):
        check_parallelism(case_cfg("1F1B", tmp_path, tmp_path / "o", "--parallelism.pp_layers=1,3"), 1)


@pytest.mark.parametrize(
    "family, overrides, match",
    [("flux", {}, "splits the shared decoder")],
)
def test_refuses_models_it_cannot_split(family, overrides, match):
    model = build_meta(family, resolve_args(family, "debugmodel", overrides))
    with pytest.raises(ConfigError, match=match):
        check_pipeline_model(model, family)


# ---- two and four gloo ranks ----------------------------------------------------------------------


def _args(scenario: str):
    def args(root: Path) -> list[str]:
        return [scenario, str(root / scenario), str(corpus_at(root))]

    return args


PP2 = _world.job("pp2", 2, WORKER, _args("pp2"), __file__, out="pp2")
PP2DP2 = _world.job("pp2dp2", 4, WORKER, _args("pp2dp2"), __file__, out="pp2dp2")


def _launched(request, job) -> tuple[Path, list[dict]]:
    """(its folder, the ranks' results, each run's parameters gathered from the ranks' files), from the
    session's one launch of its world size (tests/core/dist/_world.py)."""
    res = _world.results(request, job)
    out, ranks, nproc = res.out, res.ranks, job.world
    for name in [n for n in ranks[0] if not n.startswith("checkpoints")]:
        params: dict[str, torch.Tensor] = {}
        for r in range(nproc):
            got = torch.load(out / f"{name}.rank{r}.pt")
            for k, v in got.items():  # dp peers of one stage hold the same full tensors
                assert k not in params or torch.equal(params[k], v), (name, k)
            params |= got
        ranks[0][name]["params"] = params
    return out, ranks


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("pp")
    corpus_at(root)
    return root


@pytest.fixture(scope="module")
def pp2(request):
    return _launched(request, PP2)


@pytest.fixture(scope="module")
def pp2dp2(request):
    return _launched(request, PP2DP2)


_REFERENCES: dict[tuple, dict] = {}
"""One plain process per distinct config: the schedules' cases (gpipe, 1F1B, ...) differ in their pp flags only,
which the pp = 1 reference drops, so they share one."""


def _reference(root: Path, name: str, batch_size: int) -> dict:
    family, model, flags = CASES[name]
    key = (family, model, tuple(f for f in flags if not f.startswith("--parallelism.")), batch_size)
    if key not in _REFERENCES:
        cfg = case_cfg(name, root / "corpus", root / f"ref_{name}_{batch_size}", batch_size=batch_size)
        t = Trainer(cfg, quiet=True)
        rows = t.train().metrics
        assert len(rows) == STEPS and t.cfg.training.grad_accum == GRAD_ACCUM
        _REFERENCES[key] = {
            "loss": [r["loss"] for r in rows], "grad_norm": [r["grad_norm"] for r in rows],
            "val_loss": [r.get("val_loss") for r in rows], "val_tokens": [r.get("val_tokens") for r in rows],
            "params": {n: p.detach().clone() for n, p in t.model.named_parameters()},
        }  # fmt: skip
    return _REFERENCES[key]


def _same_run(got: dict, want: dict, param_rel: float = PP_REL) -> None:
    assert curve_max_rel(got["loss"], want["loss"])[0] <= PP_REL, (got["loss"], want["loss"])
    assert curve_max_rel(got["grad_norm"], want["grad_norm"])[0] <= PP_REL, (got["grad_norm"], want["grad_norm"])
    assert want["loss"][0] != want["loss"][-1]  # the weights moved: the comparison covers 3 updates
    # the held-out loss where validation ran (through the stages), at the same steps over the same tokens
    assert got["val_tokens"] == want["val_tokens"]
    held = [i for i, v in enumerate(want["val_loss"]) if v is not None]
    assert [i for i, v in enumerate(got["val_loss"]) if v is not None] == held
    if held:
        assert curve_max_rel([got["val_loss"][i] for i in held], [want["val_loss"][i] for i in held])[0] <= PP_REL
    assert set(got["params"]) == set(want["params"])  # the stages together hold the whole model once
    worst = max(rel_l2(got["params"][k], want["params"][k]) for k in want["params"])
    assert worst <= param_rel, worst


@pytest.mark.whole_machine  # its ranks meet at every collective: the background climbs pause
@pytest.mark.parametrize("name", TWO_RANKS)
def test_pp2_matches_one_process(pp2, root, name):
    r0, r1 = pp2[1]
    assert r0[name]["loss"] == r1[name]["loss"] and r0[name]["grad_norm"] == r1[name]["grad_norm"]
    _same_run(r0[name], _reference(root, name, BATCH))
    if name == "packed":  # validated after steps 2 and 3 (freq 2, and the last step)
        assert [v is not None for v in r0[name]["val_loss"]] == [False, True, True]


@pytest.mark.whole_machine
def test_pp2_stage_placement(pp2):
    r0, r1 = pp2[1]
    assert (r0["1F1B"]["stages"], r1["1F1B"]["stages"]) == ([0], [1])
    assert (r0["1F1B"]["layers"], r1["1F1B"]["layers"]) == (["0", "1"], ["2", "3"])
    assert (r0["interleaved1F1B"]["stages"], r1["interleaved1F1B"]["stages"]) == ([0, 2], [1, 3])
    assert (r0["interleaved1F1B"]["layers"], r1["interleaved1F1B"]["layers"]) == (["0", "2"], ["1", "3"])
    assert (r0["layers_1_3"]["layers"], r1["layers_1_3"]["layers"]) == (["0"], ["1", "2", "3"])
    for name in CASES:  # the embedding on the first stage only (a copy on the last when tied), the head on the last
        tied = name == "tied"
        assert (r0[name]["has_embedding"], r1[name]["has_embedding"]) == (True, tied)
        if tied:  # no head of its own: the embedding's copy is its weight
            assert (r0[name]["has_head"], r1[name]["has_head"]) == (False, False)
            continue
        assert (r0[name]["has_head"], r1[name]["has_head"]) == (False, True)


@pytest.mark.whole_machine
@pytest.mark.parametrize("name", FOUR_RANKS)
def test_pp2_with_data_parallel_matches_one_process(pp2dp2, root, name):
    _, ranks = pp2dp2
    assert all(r[name]["loss"] == ranks[0][name]["loss"] for r in ranks)
    assert [r[name]["stages"] for r in ranks] == [[0], [0], [1], [1]]  # pp outermost: ranks 0, 1 hold stage 0
    shards = 2 if name == "dp_shard2" else 1  # each stage sharded over its dp_shard ranks, replicated otherwise
    assert all(r[name]["wq_local_rows"] * shards == r[name]["wq_rows"] for r in ranks)
    _same_run(ranks[0][name], _reference(root, FOUR_RANKS[name][0], 2 * BATCH), param_rel=DP_PARAM_REL)


@pytest.mark.whole_machine
def test_pp2_checkpoints_resume_exactly_and_on_one_process(pp2, root):
    """A pp = 2 run saves DCP checkpoints (each stage its own parameters and AdamW state, the hyperparameters
    per parameter); resuming its step 2 at pp = 2 gives the uninterrupted run's later losses bit for bit, and
    one process (pp = 1) resumes the same checkpoint to the same losses within fp32 rounding."""
    out, (r0, r1) = pp2
    ck = r0["checkpoints"]
    assert ck == r1["checkpoints"] and ck["saved"] == ["step-2", f"step-{STEPS}"]
    assert ck["resumed_from"] == 2 and ck["resumed"] == ck["full"][2:]
    tied = r0["checkpoints_tied"]  # each stage's copy of the tied weight saved and resumed under its one name
    assert tied == r1["checkpoints_tied"] and tied["resumed_from"] == 2 and tied["resumed"] == tied["full"][2:]
    import shutil

    one = root / "pp2_ckpt_one_process"
    shutil.copytree(out / "ckpt_full" / "ckpt" / "step-2", one / "ckpt" / "step-2")
    cfg = case_cfg("1F1B", root / "corpus", one, "--parallelism.data_parallel=simple_fsdp", "--checkpoint.enable",
                   "--checkpoint.interval=2", "--checkpoint.folder=ckpt", "--checkpoint.resume=true", batch_size=BATCH)
    result = Trainer(cfg, quiet=True).train()
    assert result.resumed_from == 2
    assert curve_max_rel([r["loss"] for r in result.metrics], ck["full"][2:])[0] <= PP_REL
