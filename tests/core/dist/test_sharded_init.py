"""Sharded from the first byte: each rank builds its shards on meta and initialises them to the
one-process init's values, bit for bit, on every path and parallelism, without ever holding the
whole model (titan_core/parallel/sharded_init.py); and activation checkpointing under each
parallelism, and SimpleFSDP's resharding after forward. 2 gloo ranks (_sharded_init_worker.py, first in the
session's one 2-rank launch: _world.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import _world
import pytest


PORT = '''
import torch
from titan_core.models.common.decoder import Transformer
from titan_core.models.common.layers import rope_inv_freq


class Port(Transformer):
    """A port with an init of its own: the last parameter drawn first, the output projections halved."""

    @torch.no_grad()
    def init_weights(self, seed=None):
        gen = torch.Generator(device=self.tok_embeddings.weight.device).manual_seed(seed)
        for name, p in reversed(list(self.named_parameters())):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
                if name.endswith(("wo.weight", "w2.weight")):
                    p.mul_(0.5)
        self.inv_freq.copy_(rope_inv_freq(self.args.head_dim, self.args.rope_theta, self.args.rope_scaling))


def build_model(args):
    return Port(args)
'''

CASES = [
    "native_simple_fsdp", "native_fsdp2", "native_tp", "native_ep", "native_cp", "native_pp", "native_bf16",
    "port_simple_fsdp", "port_fsdp2", "transformers_simple_fsdp", "transformers_fsdp2", "transformers_ep",
    "flux_simple_fsdp", "flux_fsdp2",
]  # fmt: skip
MIB = 1 << 20
pytestmark = pytest.mark.whole_machine  # its ranks meet at every collective: the background climbs pause


def _hf_configs(folder: Path) -> Path:
    transformers = pytest.importorskip("transformers", reason="the transformers path needs the [hf] extra")
    folder.mkdir()
    small = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4)
    transformers.LlamaConfig(**small, intermediate_size=128, num_key_value_heads=2,
                             tie_word_embeddings=True).to_json_file(folder / "llama_tied.json")  # fmt: skip
    transformers.GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4, attn_pdrop=0.0, resid_pdrop=0.0,
                            embd_pdrop=0.0, bos_token_id=0, eos_token_id=0).to_json_file(folder / "gpt2.json")
    transformers.Qwen3MoeConfig(**small, intermediate_size=128, moe_intermediate_size=32, num_key_value_heads=2,
                                num_experts=4, num_experts_per_tok=2, head_dim=16).to_json_file(
        folder / "qwen3_moe.json")  # fmt: skip
    return folder


def _args(root: Path) -> list[str]:
    port = root / "port_model.py"
    port.write_text(PORT)
    return ["all", str(root / "out"), str(port), str(_hf_configs(root / "hf"))]


JOB = _world.job("sharded_init", 2, Path(__file__).with_name("_sharded_init_worker.py"), _args, __file__)


@pytest.fixture(scope="module")
def ranks(request):
    """The ranks' results, from the session's one 2-rank launch (_world.py)."""
    return _world.results(request, JOB).ranks


@pytest.mark.parametrize("case", CASES)
def test_sharded_init_equals_the_one_process_init(ranks, case):
    for rank in ranks:
        res = rank[case]
        assert res["compared"] > 0
        assert res["unequal"] == [], f"{case}: gathered shards differ from the one-process init in {res['unequal']}"
        # the full tensors held at once: one module's own parameters at most, never the model
        assert 0 < res["peak_full_bytes"] <= res["budget_bytes"] < res["whole_bytes"] / 2, res


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the resident set from /proc/self/status")
def test_no_rank_holds_the_whole_model_while_building(ranks):
    """What building the wider model adds to a rank's resident set: its half of the model plus one module's
    full tensors (and allocator slack), where the one-process build of the same model adds the whole."""
    for rank in ranks:
        m = rank["memory"]
        assert m["own_bytes"] == m["whole_bytes"] // 2
        assert m["budget_bytes"] < m["whole_bytes"] / 16
        # the control, measured after the sharded build (whose freed pages the allocator may hand back
        # to it): a whole build is seen nearly whole (0.90 measured)
        assert m["whole_rise"] >= 0.8 * m["whole_bytes"], m
        assert m["sharded_rise"] <= m["own_bytes"] + m["budget_bytes"] + 24 * MIB, m
        assert m["sharded_rise"] < 0.7 * m["whole_bytes"], m


AC_CASES = ["native_simple_fsdp", "native_fsdp2", "native_tp", "native_ep", "native_cp", "native_pp",
            "transformers_simple_fsdp", "transformers_fsdp2", "flux_simple_fsdp"]  # fmt: skip


@pytest.mark.parametrize("case", AC_CASES)
def test_activation_checkpointing_changes_nothing_under_each_parallelism(ranks, case):
    """fp32, 2 steps: full and selective-op checkpointing give the losses and grad norms of no checkpointing,
    bit for bit (the recompute runs the same ops, collectives included, in the same order on every rank)."""
    for rank in ranks:
        runs = rank["ac"][case]
        assert runs["full"] == runs["none"] and runs["selective"] == runs["none"], runs


# (tp 2 or pp 2 on 2 ranks leave dp_shard 1: nothing is gathered to keep; bench/sharded_build.py runs tp 2 x dp 4)
REGATHER_CASES = ["native_simple_fsdp", "native_ep", "native_bf16",
                  "transformers_simple_fsdp", "flux_simple_fsdp"]  # fmt: skip


@pytest.mark.parametrize("case", REGATHER_CASES)
def test_resharding_after_forward_keeps_a_fraction_of_the_gathered_weights_and_changes_nothing(ranks, case):
    """reshard_after_forward: the same losses and grad norms bit for bit, and the most gathered bytes alive at
    once a fraction of what keeping them costs (the whole model, or the stage's, gathered)."""
    for rank in ranks:
        kept, again = rank["regather"][case]["False"], rank["regather"][case]["True"]
        assert again["curve"] == kept["curve"]
        assert 0 < again["peak_gathered"] <= 0.5 * kept["peak_gathered"], (kept, again)
