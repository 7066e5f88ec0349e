"""`onboard recipe`: the recipe with what the ladder earned (from the ledger, hand overrides named)
and commands that run it; the torchrun line is parsed by torchrun's own argument parser."""

from __future__ import annotations

import json
import shlex

from test_cli import assert_bad_input, onboard
from torch.distributed.run import get_args_parser

from titan_core.runtime.argv import LAUNCH

from onboard.workspace.ledger import Ledger
from onboard.ladder.recipe_edit import RecipeEdit, apply_edits
from onboard.workspace.layout import Workspace


def workspace_with_an_earned_edit(tmp_path):
    assert (
        onboard("new-model", "m", "--preset", "llama3/debugmodel", "--device", "cpu", "--dir", tmp_path).exit_code == 0
    )
    ws = Workspace.load(tmp_path, "m")
    record = apply_edits(ws.recipe_path, [RecipeEdit("compile.enable", True, "graph_trainer rung: compile is faster")])
    ledger = Ledger.load(ws.ledger.path)
    ledger.append({"rung": "graph_trainer", "attempt": 1, "status": "passed", "started": "2026-12-01T00:00:00+00:00",
                   "ended": "2026-12-01T00:01:00+00:00", "recipe_edit": {"file": "recipe.toml", **record}})  # fmt: skip
    ledger.save()
    return ws


def view(tmp_path, *extra):
    result = onboard("recipe", "m", "--dir", tmp_path, "--json", *extra)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_the_recipe_lists_what_a_rung_earned_and_a_hand_override(tmp_path):
    ws = workspace_with_an_earned_edit(tmp_path)
    [earned] = view(tmp_path)["earned"]
    assert (earned["key"], earned["value"], earned["rung"], earned["in_recipe"]) == (
        "compile.enable",
        True,
        "graph_trainer",
        True,
    )
    ws.recipe_path.write_text(ws.recipe_path.read_text().replace("enable = true", "enable = false"))
    [earned] = view(tmp_path)["earned"]
    assert not earned["in_recipe"] and earned["recipe_value"] is False
    text = onboard("recipe", "m", "--dir", tmp_path)
    assert "overridden by hand: the recipe now says False" in text.stdout
    assert "[compile]" in text.stdout  # the recipe itself is printed


def parse_torchrun(line: str):
    cd, command = line.split(" && ", 1)
    argv = shlex.split(command.replace("$NNODES", "4").replace("$HEAD_NODE", "10.0.0.1"))
    assert tuple(argv[:3]) == LAUNCH  # torchrun with the config checked first (titan_core/launch.py)
    return get_args_parser().parse_args(argv[3:])


def test_commands_fill_the_torchrun_line_from_the_recipe(tmp_path):
    ws = workspace_with_an_earned_edit(tmp_path)
    got = view(tmp_path)
    assert got["commands"]["one_process"] == f"onboard train --config {ws.recipe_path}"
    # no sharded run on record, no GPU here: two processes, each given half the global batch the gates ran
    assert got["commands"]["this_host"].endswith("--nproc 2 --training.batch_size=2")
    assert got["per_rank_batch_size"] == 2 and "global batch of 4" in got["this_host_why"]
    args = parse_torchrun(got["commands"]["many_hosts"])  # a degree fills: the node count is the user's
    assert (args.nnodes, args.nproc_per_node, args.rdzv_backend, args.module) == ("4", "2", "c10d", True)
    assert (args.training_script, args.training_script_args) == ("titan_core.train", ["--config", "recipe.toml"])
    # explicit degrees: 2 replicas x 4 shards = 8 processes, 2 per host -> 4 hosts
    ws.recipe_path.write_text(ws.recipe_path.read_text() + "\n[parallelism]\ndp_replicate = 2\ndp_shard = 4\n")
    got = view(tmp_path)
    assert "--nnodes=4 " in got["commands"]["many_hosts"] and "8 processes, 2 per host" in got["many_hosts_how"]
    # 8 data-parallel ranks cannot share a global batch of 4: no per-rank flag, and the note says why
    assert "batch_size" not in got["commands"]["many_hosts"] and "does not split over 8 ranks" in got["many_hosts_how"]
    ws.recipe_path.write_text(ws.recipe_path.read_text().replace("dp_shard = 4", "dp_shard = 1\ntp = 2"))
    args = parse_torchrun(view(tmp_path)["commands"]["many_hosts"])  # tp ranks share their replica's rows
    assert args.training_script_args == ["--config", "recipe.toml", "--training.batch_size=2"]
    ws.recipe_path.write_text(ws.recipe_path.read_text().replace("dp_shard = 1\ntp = 2", "dp_shard = 4"))
    ws.recipe_path.write_text(
        ws.recipe_path.read_text().replace("dp_replicate = 2\ndp_shard = 4", "dp_replicate = 1\ndp_shard = 3")
    )
    assert_bad_input(onboard("recipe", "m", "--dir", tmp_path), "do not split into hosts of 2")


def test_a_missing_workspace_is_bad_input(tmp_path):
    assert_bad_input(onboard("recipe", "nope", "--dir", tmp_path), "no workspace 'nope'")
