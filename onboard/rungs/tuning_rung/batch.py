"""The tuning rung's batch search on its candidate runs (`BatchTrials`: the callbacks of
`onboard.rungs.tuning_rung.search.search`), and the Decisions the search took. Beside tuning_rung/rung.py
to keep that module short. Not a rung (no RUNG).

Each shape the search runs is classified against the starting batch on the same rows and timed
per token against the batch holding the field then; a `faster` one takes the field and the search
goes on from it. So the batch lever is decided by a chain of comparisons, each a Decision
(`decisions`): every shape timed, and every shape its numerics refused. The links that moved the
field are kept only when the shape the search ended on is (its curve checked if rounding); if it is
not, the starting batch holds again and those links say why.
"""

from __future__ import annotations

from onboard.rungs.tuning_rung.decisions import change_decision, keep_rule
from titan_core.config.loader import with_keys
from titan_core.memory.estimate import format_bytes
from onboard.rungs.tuning_rung.search import BatchShape, Probe
import torch


def max_doublings(batch_size: int, seq_len: int, cap_tokens: int) -> int:
    """Doublings of the batch that keep a micro-batch within `cap_tokens`: an absolute end, so a
    second visit from a raised batch cannot go on for ever."""
    n = 0
    while batch_size * 2 ** (n + 1) * seq_len <= cap_tokens:
        n += 1
    return n


def batch_values(shape: BatchShape) -> dict:
    return {"training.batch_size": shape.batch_size, "training.grad_accum": shape.grad_accum}


class BatchTrials:
    """The batch search's callbacks (onboard.rungs.tuning_rung.search.search) on the tuner's runs: each
    shape probed, classified against the starting batch on the same rows, timed against the holder."""

    def __init__(self, tuner):
        self.tuner = tuner
        self.start_label, self.start_cfg = tuner.holder, tuner.cfg
        self.start = BatchShape(tuner.cfg.training.batch_size, tuner.cfg.training.grad_accum)
        self.labels = {self.start: self.start_label}
        self.classes: dict = {}  # shape -> (Classification, the label it was judged against)
        self.holding = [self.start]  # the search's holder, for what stays alive
        self.timings: dict = {}  # shape -> its Comparison against the batch it challenged
        self.against: dict = {}  # shape -> the label of that batch (timed, or refused before timing)

    def cfg_of(self, shape):
        return with_keys(self.start_cfg, batch_values(shape))

    def measure(self, shape):
        runs, label = self.tuner.runs, self.labels.setdefault(shape, f"batch={shape.label()}")
        try:
            probe = runs.probe(label, self.cfg_of(shape))
        except torch.OutOfMemoryError as e:  # the device refused it: memory binds (batch_search)
            raise MemoryError(str(e).splitlines()[0]) from None
        if shape != self.start:  # on the same rows as the starting batch, accumulated
            self.classes[shape] = self.tuner.classify(label, self.cfg_of(shape), self.start_label, self.start_cfg)
            runs.keep_only(self.start_label, self.labels[self.holding[-1]], label)
        return Probe(probe["peak_bytes"], probe["step_time_s"],
                     {"class": self.classes[shape][0].cls} if shape in self.classes else {})  # fmt: skip

    def reject(self, shape, probe):
        if not self.classes[shape][0].rejected:
            return None
        self.against[shape] = self.labels[self.holding[-1]]
        return self.classes[shape][0].why

    def compare(self, candidate, holder):
        runs, name, against = self.tuner.runs, self.labels[candidate], self.labels[holder]
        cmp = self.timings[candidate] = runs.compare(name, against, self.tuner.proto)
        self.against[candidate] = against
        self.tuner.ctx.log(f"tuning: batch: {cmp.describe(name, against)} (per token); peak "
                           f"{format_bytes(runs.peak[name])}")  # fmt: skip
        if cmp.outcome == "faster":
            self.holding.append(candidate)
        # the start stays too: it holds the field again if the chosen batch's curve check fails
        runs.keep_only(self.start_label, self.labels[self.holding[-1]])
        return cmp

    def decisions(self, result, final_kept: bool, final_why: str) -> list[dict]:
        """The Decision (to_dict) of every shape the search timed or refused for its numerics, in
        order; `final_kept` / `final_why`: the keep rule's word on the shape it ended on."""
        out = []
        chain, chosen = self.holding[1:], self.labels[result.chosen]
        for t in result.tried:
            shape = t.shape
            if shape not in self.against:  # the start, or refused for memory before any timing (batch.why)
                continue
            cls, cmp = self.classes[shape][0], self.timings.get(shape)
            if shape == result.chosen:
                kept, why = final_kept, final_why
            elif shape in chain:  # a link that moved the field on the way to the chosen shape
                kept = final_kept
                why = f"faster; the search went on from it to {chosen}" + (
                    "" if final_kept else f", which was not kept ({final_why})")  # fmt: skip
            else:
                kept, why = keep_rule(cls, cmp, None)
            label, against = self.labels[shape], self.against[shape]
            d = change_decision(self.tuner.ctx.workspace.ledger, step="batch", label=label, values=batch_values(shape),
                                holder_cfg=self.tuner.runs.cfgs[against], holder_label=against, cls=cls, cmp=cmp,
                                kept=kept, why=why)  # fmt: skip
            out.append(d.to_dict())
        return out
