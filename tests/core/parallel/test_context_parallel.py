"""Context parallelism (titan_core/parallel/context_parallel.py).

Unit (no processes): the head-tail balancer's index, the position mask, the refusals. On gloo, each in
the session's one launch of its world size (tests/core/dist/_world.py): cp = 2 on 2 ranks for each case
of _cp_cases.CASES (causal, sliding window on sdpa, glimmer's window + NoPE layers on the naive core,
MoE, packed documents with validation), and on 4 ranks
dp_shard = 2 x cp = 2 (SimpleFSDP, FSDP2) and dp_replicate = 2 x cp = 2; each against one plain
process (cp = 1) on the same global batch: every step's loss and grad norm, every parameter's
gradient of step 1.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from _cp_cases import CASES, SEQ_LEN, STEPS, case_cfg, corpus_at
from _cp_worker import train_steps

from titan_core.config.loader import ConfigError
from titan_core.kernels.attention import FlexAttention
from titan_core.measure.numerics import curve_max_rel, rel, rel_l2
from titan_core.models.common.attention import attention_mask, mask_from_positions
from titan_core.parallel import check_parallelism
from titan_core.parallel.context_parallel import (
    ContextParallelAttention, apply_context_parallel, balanced_index, gathered_index,
)  # fmt: skip
from titan_core.models.model_builder import build_model_from_config
from titan_core.training.trainer import Trainer

sys.path.insert(0, str(Path(__file__).parents[1] / "dist"))  # _world: the session's one launch per world size
import _world  # noqa: E402

CP_REL = 1.0e-5
"""fp32, cp = 2 vs cp = 1: the same mask and softmax per query, only the attention call (an explicit
mask instead of sdpa's causal path), the token-mean sums and the gradient reduce round differently."""

WORKER = Path(__file__).with_name("_cp_worker.py")


# ---- unit: no processes ---------------------------------------------------------------------------


@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_balanced_index_covers_every_token_once_with_even_causal_work(cp):
    seq = 2 * cp * 5
    chunk = seq // (2 * cp)
    parts = [balanced_index(seq, cp, r) for r in range(cp)]
    assert torch.equal(torch.sort(torch.cat(parts)).values, torch.arange(seq))
    assert torch.equal(gathered_index(seq, cp), torch.cat(parts))
    # a query at position p attends to p + 1 keys under the causal mask
    work = [int((p + 1).sum()) for p in parts]
    assert max(work) - min(work) <= chunk * chunk  # within one chunk's work (here exactly equal)
    assert len(set(work)) == 1
    if cp > 1:  # a contiguous split is not balanced: the last rank has far more
        contiguous = [int((torch.arange(r * seq // cp, (r + 1) * seq // cp) + 1).sum()) for r in range(cp)]
        assert max(contiguous) - min(contiguous) > chunk * chunk
    assert parts[0][:chunk].tolist() == list(range(chunk))  # rank 0: the head chunk and the last one
    assert parts[0][chunk:].tolist() == list(range(seq - chunk, seq))


@pytest.mark.parametrize("window", [None, 3])
def test_mask_at_shuffled_positions_is_the_square_mask_permuted(window):
    g = torch.Generator().manual_seed(7)
    seq = 12
    segments = torch.tensor([[0] * 5 + [1] * 4 + [2] * 3, [0] * 12])
    q_pos, k_pos = torch.randperm(seq, generator=g), torch.randperm(seq, generator=g)
    got = mask_from_positions(q_pos, k_pos, window=window, q_segments=segments[:, q_pos],
                              k_segments=segments[:, k_pos])  # fmt: skip
    square = attention_mask(seq, window=window, segment_ids=segments)
    assert torch.equal(got, square[:, :, q_pos][:, :, :, k_pos])
    assert not torch.equal(got, square)  # the permutation matters


def _cfg(tmp_path, *extra: str, seq_len: int = SEQ_LEN):
    return case_cfg("causal", tmp_path, tmp_path / "out", "--parallelism.dp_shard=1", "--parallelism.cp=2",
                    f"--training.seq_len={seq_len}", *extra)  # fmt: skip


def test_refuses_a_seq_len_not_divisible_by_2cp(tmp_path):
    with pytest.raises(ConfigError, match=r"training\.seq_len \(30\).*parallelism\.cp"):
        check_parallelism(_cfg(tmp_path, seq_len=30), 2)
    assert check_parallelism(_cfg(tmp_path, seq_len=28), 2).cp == 2  # 4 chunks of 7


@pytest.mark.parametrize("kernel", ["flex", "tokamax", "splash"])
def test_refuses_a_kernel_without_an_explicit_mask(tmp_path, kernel):
    with pytest.raises(ConfigError, match=f"kernels.attention = '{kernel}'.*parallelism.cp = 2"):
        check_parallelism(_cfg(tmp_path, f"--kernels.attention={kernel}"), 2)


def test_refuses_the_transformers_path(tmp_path):
    # cp composes with tp, pp, ep, compile and the Graph Trainer (tests/core/dist/test_compose.py)
    with pytest.raises(ConfigError, match="transformers path"):
        check_parallelism(_cfg(tmp_path, "--model.family=transformers"), 2)


def test_a_core_without_an_explicit_mask_is_refused_when_wrapped():
    with pytest.raises(ConfigError, match="FlexAttention takes no explicit mask"):
        ContextParallelAttention(FlexAttention(), group=None, cp=2, rank=0)


# ---- cp = 2 and dp_shard = 2 x cp = 2 against one process ----------------------------------------


def _args(scenario: str):
    def args(root: Path) -> list[str]:
        corpus_at(root)
        return [str(root / scenario), str(root), scenario]

    return args


CP2 = _world.job("cp2", 2, WORKER, _args("cp2"), __file__, out="cp2")
DP2CP2 = _world.job("dp2cp2", 4, WORKER, _args("dp2cp2"), __file__, out="dp2cp2")


def _reference(root: Path, case: str) -> dict:
    t = Trainer(case_cfg(case, root / "corpus", root / f"ref_{case}"), quiet=True)
    rows, grads = train_steps(t)
    return {
        "loss": [r["loss"] for r in rows],
        "grad_norm": [r["grad_norm"] for r in rows],
        "val_loss": [r.get("val_loss") for r in rows],
        "val_tokens": [r.get("val_tokens") for r in rows],
        "grads": grads,
    }


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("cp")
    corpus_at(r)
    return r


@pytest.fixture(scope="module")
def references(root):
    return {case: _reference(root, case) for case in CASES}


@pytest.fixture(scope="module")
def cp2(request):
    """(its folder, the ranks' results), from the session's one 2-rank launch (tests/core/dist/_world.py)."""
    res = _world.results(request, CP2)
    return res.out, res.ranks


@pytest.fixture(scope="module")
def dp2cp2(request):
    """(its folder, the ranks' results), from the session's one 4-rank launch (tests/core/dist/_world.py)."""
    res = _world.results(request, DP2CP2)
    return res.out, res.ranks


def _assert_matches(got: dict, want: dict, grads_file: Path) -> None:
    assert len(got["loss"]) == STEPS
    assert curve_max_rel(got["loss"], want["loss"])[0] <= CP_REL, (got["loss"], want["loss"])
    assert curve_max_rel(got["grad_norm"], want["grad_norm"])[0] <= CP_REL, (got["grad_norm"], want["grad_norm"])
    grads = torch.load(grads_file)
    assert grads.keys() == want["grads"].keys()
    worst = max((rel_l2(grads[n], want["grads"][n]), n) for n in grads)
    assert worst[0] <= CP_REL, worst


@pytest.mark.whole_machine  # its ranks meet at every collective: the background climbs pause
@pytest.mark.parametrize("case", list(CASES))
def test_cp2_equals_one_process(cp2, references, case):
    want = references[case]
    out, ranks = cp2
    for rank in ranks:  # the logged loss is the all-reduced global token mean: the same on both ranks
        got = rank[case]
        _assert_matches(got, want, out / f"{case}.grads.pt")
        assert got["cp_cores"] == 2 and got["dp_world"] == 1 and got["loss_world"] == 2
        assert got["wq_local_rows"] * 2 == got["wq_rows"]  # parameters are sharded over cp too


@pytest.mark.whole_machine
def test_cp2_validation_counts_every_held_out_token_once(cp2, references):
    want = references["packed"]
    assert any(v is not None for v in want["val_loss"])
    for rank in cp2[1]:
        got = rank["packed"]
        assert got["val_tokens"] == want["val_tokens"]
        for a, b in zip(got["val_loss"], want["val_loss"]):
            assert (a is None) == (b is None), (got["val_loss"], want["val_loss"])
            assert a is None or rel(a, b) <= CP_REL, (got["val_loss"], want["val_loss"])


@pytest.mark.whole_machine
@pytest.mark.parametrize("mode, shards", [("simple_fsdp", 4), ("fsdp2", 4), ("hsdp", 2)])
def test_dp2_cp2_equals_one_process(dp2cp2, references, mode, shards):
    out, ranks = dp2cp2
    for rank in ranks:
        got = rank[mode]
        _assert_matches(got, references["causal"], out / f"{mode}.grads.pt")
        assert got["dp_world"] == 2 and got["loss_world"] == 4
        # sharded over dp_shard x cp (HSDP: replicated over dp_replicate, sharded over cp)
        assert got["wq_local_rows"] * shards == got["wq_rows"]


class _OneRankMesh:
    """What apply_context_parallel reads of the cp mesh, without a process group."""

    def get_group(self):
        return None

    def size(self):
        return 2

    def get_local_rank(self):
        return 0


def test_apply_wraps_every_sdpa_core_and_refuses_a_foreign_one(tmp_path):
    _, _, model = build_model_from_config(_cfg(tmp_path).model)
    assert apply_context_parallel(model, _OneRankMesh()) == 2
    assert all(isinstance(b.attention.core, ContextParallelAttention) for b in model.layers.values())
    _, _, model = build_model_from_config(_cfg(tmp_path).model)
    model.layers["1"].attention.core = FlexAttention()  # a core that builds its own square mask
    with pytest.raises(ConfigError, match=r"layers\.1\.attention\.core is FlexAttention"):
        apply_context_parallel(model, _OneRankMesh())
