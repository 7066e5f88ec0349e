"""Two gloo ranks (one launch for the session: conftest.py's w2): SimpleFSDP, FSDP2, TP = 2, DCP across
world sizes, flux.

Every loss comparison is against a plain eager process on the same rows (conftest.py), held
to the simple_fsdp gate's thresholds (checklists/simple_fsdp.yaml: 1e-6 relative in fp32; stated in
tests/core/core_bounds.py, which a test in tests/onboard holds equal to the checklist).
"""

from __future__ import annotations

import pytest
from _cases import CKPT, DENSE, FAMILIES, GLOBAL_BATCH, curve, max_rel, only_step_2, param_reads_per_forward, tiny_cfg

from core_bounds import BF16_LOSS_CURVE_REL, FSDP_LOSS_REL
from titan_core.measure.numerics import rel
from titan_core.train import run

pytestmark = pytest.mark.whole_machine  # its ranks meet at every collective: the background climbs pause

TOL = FSDP_LOSS_REL
BF16_TOL = BF16_LOSS_CURVE_REL


def test_ranks_log_the_same_loss(w2):
    r0, r1 = w2["ranks"]
    for kind in ("simple_fsdp", "fsdp2", "tp"):
        for fam in r0[kind]:
            assert r0[kind][fam]["loss"] == r1[kind][fam]["loss"], (kind, fam)


@pytest.mark.parametrize("family", FAMILIES)
def test_simple_fsdp_matches_one_process(w2, reference, family):
    got, want = w2["ranks"][0]["simple_fsdp"][family], reference(family, dp=2)
    assert w2["ranks"][0]["simple_fsdp"][family]["mode"] == "fully_shard"
    assert max_rel(got["loss"], want["loss"]) <= TOL
    assert max_rel(got["grad_norm"], want["grad_norm"]) <= TOL


@pytest.mark.parametrize("family", FAMILIES)
def test_fsdp2_matches_one_process(w2, reference, family):
    got, want = w2["ranks"][0]["fsdp2"][family], reference(family, dp=2)
    assert max_rel(got["loss"], want["loss"]) <= TOL
    assert max_rel(got["grad_norm"], want["grad_norm"]) <= TOL


@pytest.mark.parametrize("family", DENSE)
def test_tensor_parallel_2_matches_one_process(w2, reference, family):
    got, want = w2["ranks"][0]["tp"][family], reference(family, dp=1)
    assert max_rel(got["loss"], want["loss"]) <= TOL
    assert max_rel(got["grad_norm"], want["grad_norm"]) <= TOL


@pytest.mark.parametrize("family", DENSE)
def test_sequence_parallel_matches_one_process_with_its_collectives(w2, reference, family):
    got, want = w2["ranks"][0]["tp_sp"][family], reference(family, dp=1)
    assert max_rel(got["loss"], want["loss"]) <= TOL
    assert max_rel(got["grad_norm"], want["grad_norm"]) <= TOL
    layers = 2
    qk_norm = family != "llama3"
    assert got["comm"] == {
        # forward: the attention and MLP inputs gathered over the sequence, and the final norm's output (by the
        # vocab-parallel loss head); backward: the same count, as the transposes of the forward reduce-scatters
        "all_gather_into_tensor": 2 * (2 * layers + 1),
        # forward: attention and MLP outputs, and the vocab-split embedding's lookups summed into sequence
        # chunks; backward: the transposes of the input gathers and of the loss head's gather
        "reduce_scatter_tensor": 2 * (2 * layers + 1),
        # grads of the norms that saw a chunk of positions (2 per block + final) or of heads
        # (QK-norm, 2 per block), the vocab-parallel loss's row max and sums, the logged loss and the grad norm
        "all_reduce": 2 * layers + 1 + (2 * layers if qk_norm else 0) + 2 + 2,
    }


@pytest.mark.parametrize("family", FAMILIES)
def test_gradients_come_back_sharded(w2, family):
    for rank in w2["ranks"]:
        grads = rank["simple_fsdp"][family]["grads"]
        assert grads, "no parameters reported"
        for name, g in grads.items():
            assert g["param"] == ["S(0)"], name
            assert g["grad"] == ["S(0)"], name  # a DTensor sharded like its parameter, not a full tensor
            assert g["local_shapes_match"], name
            assert g["grad_dtype"] == "torch.float32", name


@pytest.mark.parametrize("family", FAMILIES)
def test_comm_counts_per_step(w2, family):
    """One all-gather per parameter read in forward, one reduce-scatter per read that carries a
    gradient, and three all-reduces: the step's valid-token count (the loss is the global token
    mean), the logged loss and the global grad norm."""
    reads = param_reads_per_forward(family)
    counts = w2["ranks"][0]["simple_fsdp"][family]["comm"]
    assert counts == {
        "all_gather_into_tensor": reads,
        "reduce_scatter_tensor": reads,
        "all_reduce": 3,
    }


def test_replicate_mode_all_reduces_and_matches(w2, reference):
    got = w2["ranks"][0]["replicate"]
    assert got["mode"] == "replicate"
    assert max_rel(got["loss"], reference("llama3", dp=2)["loss"]) <= TOL
    # every rank stores every parameter: nothing to gather, one all-reduce per gradient, one for
    # the valid-token count, one for the logged loss, and none for the grad norm (each rank holds
    # whole gradients)
    reads = param_reads_per_forward("llama3")
    assert got["comm"] == {"all_reduce": reads + 2}
    for name, g in got["grads"].items():
        assert g["param"] == ["R", "S(0)"] and g["grad"] == ["R", "S(0)"], name  # S(0) over a 1-rank dim: whole


def test_flux_sharded_and_replicated_match_one_process(w2, flux_reference):
    """The flux diffusion transformer on 2 ranks, SimpleFSDP and HSDP's replicate dimension (2 x 1),
    against one plain process (HSDP 2 x 2 is in test_four_ranks.py)."""
    one = flux_reference
    got = w2["ranks"][0]["flux"]
    assert (got["simple_fsdp"]["mode"], got["hsdp"]["mode"]) == ("fully_shard", "replicate")
    for name in ("simple_fsdp", "hsdp"):
        assert max_rel(got[name]["loss"], one["loss"]) <= TOL, name
        assert max_rel(got[name]["grad_norm"], one["grad_norm"]) <= TOL, name
    assert one["loss"][-1] < one["loss"][0]


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_policy_reads_bf16_and_keeps_fp32_master(w2, family):
    for rank in w2["ranks"]:
        b = rank["bf16"][family]
        assert b["read_dtype"] == "torch.bfloat16"
        assert b["stored_dtype"] == "torch.float32" and b["stored_is_dtensor"]
        assert b["read_is_cast_of_full_master"]  # the gathered weight is the fp32 master rounded once
        assert b["grad_dtype"] == "torch.float32"
        # the same step-1 rows as the fp32 SimpleFSDP run: held to the gate's bf16 bound per step
        e = rel(b["loss"], rank["simple_fsdp"][family]["loss"][0])
        assert e <= BF16_TOL, f"bf16-param step-1 loss {e:.2e} from fp32 > {BF16_TOL:g} (simple_fsdp bf16_loss_curve)"
        # gathered in bf16, gradients reduced in fp32 (the policy's reduce dtype)
        assert b["comm_dtypes"]["all_gather_into_tensor"] == ["bfloat16"]
        assert b["comm_dtypes"]["reduce_scatter_tensor"] == ["float32"]


def test_bf16_reduce_dtype_reduces_in_bf16(w2):
    b = w2["ranks"][0]["bf16_reduce_bf16"]
    assert b["comm_dtypes"]["all_gather_into_tensor"] == ["bfloat16"]
    assert b["comm_dtypes"]["reduce_scatter_tensor"] == ["bfloat16"]
    assert b["grad_dtype"] == "torch.float32" and b["stored_dtype"] == "torch.float32"  # cast back onto the master


def test_dcp_saved_at_2_ranks_resumes_at_1(w2, tmp_path):
    saved_by_two = w2["ranks"][0]["dcp_saved_at_2"]
    out = only_step_2(w2["root"] / "out" / "dcp_a", tmp_path / "resume")
    resumed = run(tiny_cfg("llama3", out, *CKPT, steps=4), quiet=True)
    assert resumed.resumed_from == 2 and resumed.world_size == 1
    assert [m["step"] for m in resumed.metrics] == [3, 4]
    assert max_rel(curve(resumed.metrics)["loss"], saved_by_two["loss"][2:]) <= TOL
    assert max_rel(curve(resumed.metrics)["grad_norm"], saved_by_two["grad_norm"][2:]) <= TOL


def test_dcp_saved_at_1_rank_resumes_at_2(w2):
    resumed = w2["ranks"][0]["dcp_resumed_at_2"]
    assert resumed["resumed_from"] == 2
    assert max_rel(resumed["loss"], w2["one_rank_dcp"]["loss"][2:]) <= TOL
    assert max_rel(resumed["grad_norm"], w2["one_rank_dcp"]["grad_norm"][2:]) <= TOL


def test_dcp_refuses_a_different_global_batch(w2, tmp_path):
    from titan_core.config import ConfigError

    out = only_step_2(w2["root"] / "out" / "dcp_a", tmp_path / "resume")
    with pytest.raises(ConfigError, match=r"global batch is batch_size 2 x 2 data-parallel rank\(s\) = 4 rows"):
        run(tiny_cfg("llama3", out, *CKPT, steps=4, batch_size=GLOBAL_BATCH // 2), quiet=True)
