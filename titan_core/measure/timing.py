"""One timing protocol for every "which is faster?" question, with the noise in view.

A single timed step on a shared machine is not evidence: the same step measured 0.083 s
and 0.137 s in one run here. So every keep/choose decision (a kernel, an execution mode,
a batch size, a flag) and every benchmark ratio goes through `compare`: the two candidates
run interleaved, A B B A A B ..., so drift in the machine's load falls on both alike; each
round gives one paired ratio candidate / baseline, the estimate is their geometric mean with
a Student-t interval on the mean of the log ratios. The outcome is `slower` or `faster` only
when the interval excludes 1 *and* the estimate is beyond `min_effect`, otherwise
`indistinguishable`; a comparison whose interval is not finite, that kept fewer than two
rounds or that its budget left no time for is `not measured`, which never decides: a caller
treats every outcome but `faster` and `slower` as "what it holds stands".

**Load decides nothing; it is recorded.** Other processes on the machine slow both sides'
interleaved steps alike, so a paired interval that rules out 1 decides whatever the foreign
load (on a shared machine that is the measurement that matters: a thread count that doubles
the step when a core is busy). The machine's load is kept beside the answer (`load_before`,
`load_after`, `foreign_cores`, and `load_note` when it was heavy or moved) for a person to read.

**Rounds stop once the answer is known**: the outcome settled (the interval excludes 1 beyond
`min_effect`), the interval narrow enough, or a settled outcome unreachable within the rounds
and seconds left (the interval projected at the most rounds the budget allows still holds 1).
Looking after every round from `min_rounds` on makes a 99% interval's error rate a few percent
rather than one; `min_effect` keeps such an error small. `budget_s` bounds every comparison of
one protocol object together (a caller's whole timing budget: several comparisons, one clock).

`ratio` is always candidate time / baseline time: above 1 the candidate is slower. Two runs
timed apart are never compared here: their ratio is context, without an interval or an outcome.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import lru_cache

from titan_core.runtime import cpu_load
from titan_core.runtime.cpu_load import LoadSnapshot

INTERVAL_RATIO_CAP = 100.0
"""An interval whose high end is more than this many times its low end says nothing a person can use
(a two-round bf16 timing once gave 0.00-512246.96): such a comparison is `not measured`."""

NOT_MEASURED = "not measured"
"""The outcome of a comparison no figure of which may decide (see the module docstring)."""


FOREIGN_NOTE_CORES = 0.5
"""Other processes holding more cores than this on ours, on average, is said beside the answer (`load_note`)."""
LOAD_NOTE_CHANGE = 1.0
"""The 1-minute load average moving more than this (beyond this process's own threads) is said too."""


class Budget:
    """Seconds that every comparison of one protocol may take together, counted from the first."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.started: float | None = None

    def left(self, now: float) -> float:
        if self.started is None:
            self.started = now
        return self.seconds - (now - self.started)


@dataclass(frozen=True)
class TimingProtocol:
    """How long to keep measuring, and what counts as a difference."""

    warmup: int = 1
    """Rounds run and discarded before any is kept."""
    min_rounds: int = 6
    """Kept rounds before any stopping rule may stop the measuring (and the fewest a decision rests on)."""
    max_rounds: int = 40
    """Kept rounds at most: past this the answer is whatever the interval says then."""
    max_seconds: float = 120.0
    """Wall-clock cap on one comparison, warm-up included."""
    ci_half_width: float = 0.08
    """Stop once the interval lies within ratio x/÷ (1 + this)."""
    confidence: float = 0.99
    """Two-sided confidence of the interval."""
    min_effect: float = 0.02
    """A ratio within 1 x/÷ (1 + this) is `indistinguishable` however narrow its interval."""
    stop_when_settled: bool = True
    """Stop as soon as the outcome is settled or out of reach (a decision needs no more); False: go on
    until the interval is narrow or a cap is hit (a benchmark, whose figure is the answer)."""
    budget_s: float = math.inf
    """Wall-clock seconds all comparisons timed with this protocol object may take together (a
    caller's whole timing budget): each comparison's cap is what is left of it, and one that starts with
    nothing left is `not measured`. inf: no budget beyond `max_seconds` per comparison."""
    budget: Budget | None = field(default=None, compare=False, repr=False)
    """The shared clock of `budget_s` (made from it; `dataclasses.replace` keeps sharing it)."""

    def __post_init__(self):
        if self.min_rounds < 2 or self.max_rounds < self.min_rounds or self.warmup < 0:
            raise ValueError(f"timing protocol needs 2 <= min_rounds <= max_rounds and warmup >= 0: {self}")
        if not (0 < self.confidence < 1) or self.ci_half_width <= 0 or self.min_effect < 0:
            raise ValueError(f"timing protocol needs 0 < confidence < 1, ci_half_width > 0, min_effect >= 0: {self}")
        if not (self.max_seconds > 0 and self.budget_s > 0):
            raise ValueError(f"timing protocol needs max_seconds > 0 and budget_s > 0 (inf: none): {self}")
        if self.budget is None and math.isfinite(self.budget_s):
            object.__setattr__(self, "budget", Budget(self.budget_s))

    @classmethod
    def from_dict(cls, values: dict | None) -> "TimingProtocol":
        """The one way a protocol is built from settings (a checklist's `params.timing`, a bench's
        flags, a job handed to a subprocess). A key that is None keeps its default; without
        `min_rounds`, a `max_rounds` below the default lowers it too (a short smoke run). Unknown
        keys are an error naming them."""
        values = {k: v for k, v in (values or {}).items() if v is not None}
        known = set(cls.__dataclass_fields__) - {"budget"}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown timing protocol keys {unknown} (known: {', '.join(sorted(known))})")
        if "min_rounds" not in values and "max_rounds" in values:
            values["min_rounds"] = min(cls.min_rounds, values["max_rounds"])
        return cls(**values)

    def settings(self) -> dict:
        """The protocol's settings as plain values (a report's record of what it timed with)."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "budget"}

    def describe_budget(self) -> str:
        """How long this protocol may time, in one line a caller prints before its comparisons."""
        each = f"each comparison at most {self.max_rounds} rounds and {self.max_seconds:g} s"
        whole = f"{self.budget_s:g} s of timing in all, " if math.isfinite(self.budget_s) else ""
        return f"{whole}{each}, stopping once its outcome is settled or out of reach"


@dataclass
class Comparison:
    """The answer of the protocol: the ratio candidate / baseline, its interval, and the outcome."""

    outcome: str
    """faster | slower | indistinguishable (the candidate, against the baseline) | not measured
    (no figure here may decide: `not_measured_why`)."""
    ratio: float
    """Candidate time / baseline time (geometric mean of the paired ratios)."""
    ci_low: float
    """Low end of the ratio's interval at `confidence` (0.0 when the interval is not finite)."""
    ci_high: float
    """High end (inf when the interval is not finite)."""
    confidence: float
    rounds: int
    """Kept rounds (pairs) the answer rests on."""
    stopped: str
    """Why measuring stopped: settled (the interval excludes 1 beyond min_effect), interval (narrow
    enough), unreachable (no settled outcome within the rounds and seconds left), max_rounds,
    max_seconds, budget (the protocol's budget_s ran out)."""
    candidate_median_s: float
    baseline_median_s: float
    paired: bool = True
    """True for every answer `compare` gives; an older record of two runs timed apart says False, and
    nothing reads such a record as a decision."""
    load_before: float | None = None
    """The machine's 1-minute load average when measuring began (None where the OS has none)."""
    load_after: float | None = None
    """The 1-minute load average when measuring ended."""
    foreign_cores: float | None = None
    """Cores' worth of CPU other processes held on our cores during the (last) attempt, on average;
    None where it was not measured (no /proc/stat, a window too short to resolve)."""
    not_measured_why: str | None = None
    """Why the outcome is `not measured`: the figure and the protocol's limit it broke."""
    load_note: str | None = None
    """What the machine's load did meanwhile when it was heavy or moved (FOREIGN_NOTE_CORES,
    LOAD_NOTE_CHANGE): said beside the answer, which it does not change (both sides saw it)."""
    candidate_times_s: list[float] = field(default_factory=list)
    baseline_times_s: list[float] = field(default_factory=list)

    @property
    def speedup(self) -> float:
        """Baseline time / candidate time: above 1 the candidate is faster."""
        return 1.0 / self.ratio

    @property
    def finite(self) -> bool:
        """Whether the ratio and its interval are finite, positive numbers (a figure at all)."""
        return all(math.isfinite(v) and v > 0 for v in (self.ratio, self.ci_low, self.ci_high))

    def describe(self, candidate: str = "candidate", baseline: str = "baseline") -> str:
        """One line with the interval, e.g. 'fused_ce is 1.42x faster than plain (99% CI 1.35-1.50x, 12 rounds)';
        for `not measured`, why (and no interval)."""
        pct = f"{self.confidence:.0%}"
        if self.outcome == NOT_MEASURED:
            why = self.not_measured_why or "no figure may decide"
            return f"{candidate} against {baseline} was not measured: {why} ({self.rounds} rounds{self._how()})"
        if self.outcome == "faster":
            lo, hi = 1 / self.ci_high, 1 / self.ci_low
            head = f"{candidate} is {1 / self.ratio:.2f}x faster than {baseline}"
        elif self.outcome == "slower":
            lo, hi = self.ci_low, self.ci_high
            head = f"{candidate} is {self.ratio:.2f}x slower than {baseline}"
        else:
            lo, hi = self.ci_low, self.ci_high
            head = f"{candidate} and {baseline} are indistinguishable (time ratio {self.ratio:.2f}"
            return f"{head}, {pct} CI {lo:.2f}-{hi:.2f}, {self.rounds} rounds{self._how()})"
        return f"{head} ({pct} CI {lo:.2f}-{hi:.2f}x, {self.rounds} rounds{self._how()})"

    def short(self) -> str:
        """A table cell: speed-up of the candidate with its interval, e.g. '1.29x (1.21-1.38)', or '~1 (0.93-1.08)';
        'not measured (why)' when no figure may decide."""
        if self.outcome == NOT_MEASURED:
            return f"not measured ({self.not_measured_why or 'no figure may decide'})"
        lo, hi = 1 / self.ci_high, 1 / self.ci_low
        head = "~1" if self.outcome == "indistinguishable" else f"{self.speedup:.2f}x"
        return f"{head} ({lo:.2f}-{hi:.2f})"

    def _how(self) -> str:
        parts = []
        if self.stopped not in ("interval", "settled"):
            parts.append(f"stopped: {self.stopped}" if self.stopped == "unreachable" else f"stopped at {self.stopped}")
        if self.load_before is not None:
            parts.append(f"load {self.load_before:.1f}")
        if self.foreign_cores is not None:
            parts.append(f"other processes {self.foreign_cores:.2f} cores")
        return "".join(f", {p}" for p in parts)

    def to_dict(self, *, with_samples: bool = False) -> dict:
        d = asdict(self)
        if not with_samples:
            d.pop("candidate_times_s")
            d.pop("baseline_times_s")
        d["speedup"] = self.speedup
        return d


@lru_cache(maxsize=None)
def t_quantile(p: float, df: int) -> float:
    """The p-quantile (p > 0.5) of Student's t with `df` degrees of freedom.

    By bisection on the CDF, the density integrated with Simpson's rule: exact to ~1e-6,
    which is all an interval needs, and no statistics package to depend on.
    """
    if not (0.5 < p < 1) or df < 1:
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and df >= 1, got p={p}, df={df}")
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def pdf(x: float) -> float:
        return math.exp(log_c - (df + 1) / 2 * math.log1p(x * x / df))

    def cdf(x: float, n: int = 2000) -> float:
        h = x / n
        s = pdf(0.0) + pdf(x) + sum((4 if i % 2 else 2) * pdf(i * h) for i in range(1, n))
        return 0.5 + s * h / 3

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        hi *= 2
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def _interval(logs: list[float], confidence: float) -> tuple[float, float, float]:
    """(mean, low, high) of the log ratios' mean at `confidence`."""
    n = len(logs)
    mean = statistics.fmean(logs)
    if n < 2:
        return mean, -math.inf, math.inf
    half = t_quantile(0.5 + confidence / 2, n - 1) * statistics.stdev(logs) / math.sqrt(n)
    return mean, mean - half, mean + half


def _outcome(mean: float, lo: float, hi: float, protocol: TimingProtocol) -> str:
    margin = math.log1p(protocol.min_effect)
    if lo > 0 and mean >= margin:
        return "slower"
    if hi < 0 and mean <= -margin:
        return "faster"
    return "indistinguishable"


def _exp(x: float) -> float:
    """exp that saturates at inf instead of raising (a 2-round t interval can reach e^700)."""
    return math.exp(x) if x < 709.0 else math.inf


def _result(mean, lo, hi, cand, base, protocol, stopped, **machine) -> Comparison:
    """The Comparison of a log-ratio estimate `mean` with its interval [lo, hi]; `not measured` when
    the interval is not finite or rests on fewer than 2 rounds. `machine`: load_before, load_after,
    foreign_cores, load_note."""
    rounds = min(len(cand), len(base))
    c = Comparison(
        outcome=_outcome(mean, lo, hi, protocol),
        ratio=_exp(mean),
        ci_low=_exp(lo),
        ci_high=_exp(hi),
        confidence=protocol.confidence,
        rounds=rounds,
        stopped=stopped,
        candidate_median_s=statistics.median(cand),
        baseline_median_s=statistics.median(base),
        candidate_times_s=list(cand),
        baseline_times_s=list(base),
        **machine,
    )
    if rounds < 2:
        c.outcome, c.not_measured_why = NOT_MEASURED, f"{rounds} kept round(s): an interval needs at least 2"
    elif not c.finite:
        c.outcome, c.not_measured_why = NOT_MEASURED, f"the interval ({c.ci_low:.3g}-{c.ci_high:.3g}) is not finite"
    elif c.ci_high / c.ci_low > INTERVAL_RATIO_CAP:
        c.outcome = NOT_MEASURED
        c.not_measured_why = f"the interval ({c.ci_low:.3g}-{c.ci_high:.3g}) is too wide to say anything"
    return c


def _load_note(before: LoadSnapshot, after: LoadSnapshot, foreign: float | None) -> str | None:
    """What the machine's load did between the two snapshots, when it was heavy or moved; None: quiet."""
    said = []
    if foreign is not None and foreign > FOREIGN_NOTE_CORES:
        said.append(f"other processes held {foreign:.2f} cores on average")
    if before.load_1m is not None and after.load_1m is not None:
        change = after.load_1m - before.load_1m
        if change - cpu_load.load_rise_own_bound(before, after) > LOAD_NOTE_CHANGE:
            said.append(f"the 1-minute load average rose {before.load_1m:.2f} -> {after.load_1m:.2f}, beyond this "
                        "process's own threads")  # fmt: skip
        elif change < -LOAD_NOTE_CHANGE:
            said.append(f"the 1-minute load average fell {before.load_1m:.2f} -> {after.load_1m:.2f}")
    if not said:
        return None
    return "; ".join(said) + ": both sides' interleaved rounds ran under it"


def compare(
    candidate: Callable[[], float],
    baseline: Callable[[], float],
    protocol: TimingProtocol | None = None,
    *,
    clock: Callable[[], float] = time.perf_counter,
    probe: Callable[[], LoadSnapshot] = cpu_load.snapshot,
) -> Comparison:
    """Time `candidate` against `baseline` interleaved until the answer is known (module docstring).

    Each callable runs one sample (e.g. one training step, synchronised) and returns its
    duration in seconds (`timed` makes one from a function). `clock` measures the wall-clock
    caps, so a test can script both the samples and the time; `probe` snapshots the machine
    around the comparison (`cpu_load.snapshot`), so a test can script its load too.
    """
    p = protocol or TimingProtocol()
    cap = p.max_seconds
    if p.budget is not None:
        left = p.budget.left(clock())
        if left <= 0:
            c = Comparison(outcome=NOT_MEASURED, ratio=math.nan, ci_low=0.0, ci_high=math.inf,
                           confidence=p.confidence, rounds=0, stopped="budget", candidate_median_s=math.nan,
                           baseline_median_s=math.nan)  # fmt: skip
            c.not_measured_why = f"the timing budget of {p.budget_s:g} s was spent before this comparison began"
            return c
        cap = min(cap, left)
    before = probe()
    mean, lo, hi, cand, base, stopped = _rounds(candidate, baseline, p, clock, cap)
    after = probe()
    foreign = cpu_load.foreign_cores(before, after)
    if stopped == "max_seconds" and cap < p.max_seconds:
        stopped = "budget"
    return _result(mean, lo, hi, cand, base, p, stopped, load_before=before.load_1m,
                   load_after=after.load_1m, foreign_cores=foreign, load_note=_load_note(before, after, foreign))  # fmt: skip


def _settled(mean: float, lo: float, hi: float, n: int, elapsed: float, p: TimingProtocol, cap: float) -> str | None:
    """Why the rounds may stop after `n` kept ones (None: go on): the outcome is settled, the interval
    is narrow, or no settled outcome can be reached with the rounds the caps leave (the interval's
    half-width projected there, the spread as it is now, still reaches 1)."""
    if n < p.min_rounds:
        return None
    if p.stop_when_settled and _outcome(mean, lo, hi, p) != "indistinguishable":
        return "settled"
    half = (hi - lo) / 2
    if half <= math.log1p(p.ci_half_width):
        return "interval"
    if not p.stop_when_settled:
        return None
    per_round = elapsed / n if n else math.inf
    reachable = min(p.max_rounds, n + int(max(0.0, cap - elapsed) / per_round) if per_round > 0 else p.max_rounds)
    if reachable <= n:
        return None  # the caps stop it next, saying which
    spread = half / t_quantile(0.5 + p.confidence / 2, n - 1) * math.sqrt(n)  # the log ratios' stdev
    projected = t_quantile(0.5 + p.confidence / 2, reachable - 1) * spread / math.sqrt(reachable)
    if projected >= abs(mean) or abs(mean) < math.log1p(p.min_effect) and projected > math.log1p(p.ci_half_width):
        return "unreachable"
    return None


def _rounds(candidate, baseline, p: TimingProtocol, clock, cap: float) -> tuple:
    """One comparison's interleaved rounds: (mean, low, high, candidate times, baseline times, stopped)."""
    start = clock()
    cand: list[float] = []
    base: list[float] = []
    logs: list[float] = []
    stopped = "max_rounds"
    kept_from = None
    for i in range(p.warmup + p.max_rounds):
        # A B, then B A: each candidate goes first half of the time
        if i % 2 == 0:
            c, b = candidate(), baseline()
        else:
            b = baseline()
            c = candidate()
        if i < p.warmup:
            kept_from = clock()
            continue
        if c <= 0 or b <= 0:
            raise ValueError(f"a timed sample must be positive seconds, got candidate {c}, baseline {b}")
        cand.append(c)
        base.append(b)
        logs.append(math.log(c / b))
        now = clock()
        if len(logs) >= 2:
            mean, lo, hi = _interval(logs, p.confidence)
            why = _settled(mean, lo, hi, len(logs), now - (kept_from if kept_from is not None else start),
                           p, cap - ((kept_from if kept_from is not None else start) - start))  # fmt: skip
            if why is not None:
                stopped = why
                break
        if now - start > cap and len(logs) >= 2:
            stopped = "max_seconds"
            break
    return (*_interval(logs, p.confidence), cand, base, stopped)


def timed(fn: Callable[[], object], sync: Callable[[], None] | None = None) -> Callable[[], float]:
    """A sample for `compare`: run `fn` once between two synchronisations, return the seconds."""

    def sample() -> float:
        if sync is not None:
            sync()
        t0 = time.perf_counter()
        fn()
        if sync is not None:
            sync()
        return time.perf_counter() - t0

    return sample
