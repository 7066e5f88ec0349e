"""The compile rung's own probing compiles nothing twice: its output carries no dynamo
"recompile_limit" warning, which reads like a problem of the model's port.

Before the fix, explain_blocks' input-recording hooks ran inside each block's in-place compiled
call and were traced once per block (their `path` a new constant each time): a model with 8 or more
blocks made dynamo warn "hit config.recompile_limit (8)" about function 'hook'."""

from __future__ import annotations

import json
import logging


from narrow import narrow_workspace
from onboard.ladder.contract import RungContext, settle_runs
from onboard.ladder.gates import evaluate, gate_passed, load_checklist
from onboard.rungs import compile_rung, eager_rung
from onboard.workspace.layout import Workspace

BLOCKS = 8
"""With the loss head, one more compiled module than dynamo's default recompile_limit (8)."""


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _run(module, ws, tmp_path, evidence):
    attempt = tmp_path / "runs" / module.RUNG / "attempt-1"
    attempt.mkdir(parents=True)
    lines: list[str] = []
    ctx = RungContext(workspace=ws, attempt_dir=attempt, evidence=evidence, log=lines.append, timing_profile="quick")
    result = module.run(ctx)
    settle_runs(result.measurements, ctx.runs)
    return result, lines


def test_compile_rung_on_eight_blocks_raises_no_recompile_warning(tmp_path, capfd):
    ws = narrow_workspace(tmp_path, "llama3")
    config = json.loads(ws.hf_config_path.read_text())
    ws.hf_config_path.write_text(json.dumps({**config, "num_hidden_layers": BLOCKS}))
    # aot_eager: the probe's recompiles are dynamo's, the same under every backend; inductor costs minutes here
    ws.recipe_path.write_text(ws.recipe_path.read_text() + '\n[compile]\nbackend = "aot_eager"\n')
    ws = Workspace.load(tmp_path, "llama3")
    eager, _ = _run(eager_rung, ws, tmp_path, {})
    capfd.readouterr()  # only the compile rung's output is judged
    # torch's handlers write to the stderr object of when torch was imported (pytest's, while collecting),
    # and its loggers do not propagate: their records are read at the source too
    records = _Records()
    loggers = [logging.getLogger(n) for n in ("torch", "torch._dynamo", "torch._inductor")]
    for log in loggers:
        log.addHandler(records)
    try:
        result, lines = _run(compile_rung, ws, tmp_path, {"eager": eager.measurements})
    finally:
        for log in loggers:
            log.removeHandler(records)
    captured = capfd.readouterr()
    output = "\n".join([captured.out, captured.err, *lines, *records.lines])
    assert "recompile_limit" not in output and "cache_size_limit" not in output, output[-3000:]
    criteria = evaluate(load_checklist("compile"), result.measurements, {"eager": eager.measurements}, {})
    assert gate_passed(criteria), [c["name"] for c in criteria if not c["ok"]]
    per_module = result.details["per_module"]
    assert len(per_module) == BLOCKS + 1 and all(v["graphs"] == 1 for v in per_module.values())
