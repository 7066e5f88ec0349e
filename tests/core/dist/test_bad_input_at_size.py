"""Bad input of the at-size features as a user meets it through `python -m titan_core.train`: a
combination titan_core still refuses, an activation-checkpointing mode on a model with no blocks to
wrap, and an init the shards cannot reproduce each end in one line naming the cause, exit 2, and
nothing written (no metrics, no checkpoint), on one process and on 2 gloo ranks."""

from __future__ import annotations

import pytest
from _cases import overrides
from tiny_flags import tiny_run_flags

from titan_core.train import main

pytestmark = pytest.mark.whole_machine  # the 2-rank cases meet at every collective

REVISITING = '''
import torch
from titan_core.models.llama3.model import Llama3


class Revisiting(Llama3):
    """An init that goes back to the embedding once every block is written (closed by then on a rank)."""

    def init_weights(self, seed=None):
        super().init_weights(seed)
        with torch.no_grad():
            self.tok_embeddings.weight.mul_(1.0)


def build_model(args):
    return Revisiting(args)
'''
NO_BLOCKS = '''
from torch import nn
from titan_core.models.llama3.model import Llama3


def build_model(args):
    model = Llama3(args)
    model.layers = nn.ModuleDict()  # a port that keeps no decoder blocks where titan_core looks for them
    return model
'''


def _port(tmp_path, name: str, text: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    return f"--model.module_file={path}"


def _refused(tmp_path, capfd, argv: list[str]) -> str:
    out = tmp_path / "out"
    code = main([*argv, overrides("llama3"), *tiny_run_flags(out, steps=2, batch_size=2), "--checkpoint.enable",
                 "--checkpoint.folder=ckpt"])  # fmt: skip
    err = capfd.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1, err
    assert "Traceback" not in err.split("the last lines of its output")[0]
    assert not (out / "metrics.jsonl").exists() and not (out / "ckpt").exists()  # nothing written
    return errors[0]


def test_checkpointing_under_the_graph_trainer(tmp_path, capfd):
    line = _refused(tmp_path, capfd, ["--activation_checkpoint.mode=full", "--graph_trainer.enable"])
    assert "activation_checkpoint.mode = full with the Graph Trainer" in line


def test_checkpointing_a_model_without_blocks(tmp_path, capfd):
    line = _refused(tmp_path, capfd, ["--activation_checkpoint.mode=full", _port(tmp_path, "no_blocks", NO_BLOCKS)])
    assert "this model has no decoder blocks (model.layers is empty)" in line


def test_a_combination_still_refused_on_two_ranks(tmp_path, capfd):
    line = _refused(tmp_path, capfd, ["--nproc", "2", "--parallelism.pp=2", "--parallelism.dp_shard=1",
                                      "--graph_trainer.enable"])  # fmt: skip
    assert "parallelism.pp > 1 does not support graph_trainer.enable" in line


def test_an_init_the_shards_cannot_reproduce_on_two_ranks(tmp_path, capfd):
    line = _refused(tmp_path, capfd, ["--nproc", "2", _port(tmp_path, "revisiting", REVISITING),
                                      "--training.dtype=bfloat16", "--training.mixed_precision_param=bfloat16"])
    assert "returns to tok_embeddings.weight" in line and "bfloat16" in line
