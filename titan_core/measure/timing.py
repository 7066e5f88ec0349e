"""One timing protocol for every "which is faster?" question, with the noise in view.

A single timed step on a shared machine is not evidence: the same step measured 0.083 s
and 0.137 s in one run here. So every keep/choose decision (a kernel, an execution mode,
a batch size, a flag) and every benchmark ratio goes through `compare`: the two candidates
run interleaved, A B B A A B ..., so drift in the machine's load falls on both alike; each
round gives one paired ratio candidate / baseline, the estimate is their geometric mean with
a Student-t interval on the mean of the log ratios, and rounds go on until the interval is
narrow enough or a cap is reached (TimingProtocol says each number). The outcome is `slower`
or `faster` only when the interval excludes 1 *and* the estimate is beyond `min_effect`,
otherwise `indistinguishable`; a comparison the machine's load disturbed (`cpu_load`), or
whose interval is not finite, is `not measured`, which never decides: a caller treats every
outcome but `faster` and `slower` as "what it holds stands".

`ratio` is always candidate time / baseline time: above 1 the candidate is slower.
`compare_samples` applies the same statistics to two runs timed apart (unpaired), for
putting one run's step times beside another's; it says `paired: false` and is wider.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import lru_cache

from titan_core.measure import cpu_load
from titan_core.measure.cpu_load import LoadSnapshot

NOT_MEASURED = "not measured"
"""The outcome of a comparison no figure of which may decide (see the module docstring)."""


@dataclass(frozen=True)
class TimingProtocol:
    """How long to keep measuring, and what counts as a difference."""

    warmup: int = 1
    """Rounds run and discarded before any is kept."""
    min_rounds: int = 6
    """Kept rounds before the interval may stop the measuring (and the fewest a decision rests on)."""
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
    max_foreign_cores: float = 0.5
    """The most cores' worth of CPU other processes may hold on our cores, on average over the
    comparison (`cpu_load.foreign_cores`). Half a core: on a machine of a few cores that is
    enough to land on one side's steps more than the other's and skew a paired ratio by more
    than `min_effect`. inf: never judged."""
    max_load_change: float = 1.0
    """The most the 1-minute load average may move between the comparison's start and end, less
    the rise this process's own threads explain (`cpu_load.load_rise_own_bound`): one more
    runnable job than when it began. inf: never judged."""
    retries_when_disturbed: int = 1
    """How many times a disturbed comparison runs again, whole, before it is `not measured`."""

    def __post_init__(self):
        if self.min_rounds < 2 or self.max_rounds < self.min_rounds or self.warmup < 0:
            raise ValueError(f"timing protocol needs 2 <= min_rounds <= max_rounds and warmup >= 0: {self}")
        if not (0 < self.confidence < 1) or self.ci_half_width <= 0 or self.min_effect < 0:
            raise ValueError(f"timing protocol needs 0 < confidence < 1, ci_half_width > 0, min_effect >= 0: {self}")
        if not (self.max_foreign_cores >= 0 and self.max_load_change >= 0 and self.retries_when_disturbed >= 0):
            raise ValueError(
                f"timing protocol needs max_foreign_cores >= 0, max_load_change >= 0 (inf: not judged) and "
                f"retries_when_disturbed >= 0: {self}"
            )

    @classmethod
    def from_dict(cls, values: dict | None) -> "TimingProtocol":
        """The one way a protocol is built from settings (a checklist's `params.timing`, a bench's
        flags, a job handed to a subprocess). A key that is None keeps its default; without
        `min_rounds`, a `max_rounds` below the default lowers it too (a short smoke run). Unknown
        keys are an error naming them."""
        values = {k: v for k, v in (values or {}).items() if v is not None}
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown timing protocol keys {unknown} (known: {', '.join(sorted(known))})")
        if "min_rounds" not in values and "max_rounds" in values:
            values["min_rounds"] = min(cls.min_rounds, values["max_rounds"])
        return cls(**values)


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
    """Why measuring stopped: interval (narrow enough), max_rounds, max_seconds."""
    candidate_median_s: float
    baseline_median_s: float
    paired: bool = True
    load_before: float | None = None
    """The machine's 1-minute load average when measuring began (None where the OS has none)."""
    load_after: float | None = None
    """The 1-minute load average when measuring ended."""
    foreign_cores: float | None = None
    """Cores' worth of CPU other processes held on our cores during the (last) attempt, on average;
    None where it was not measured (no /proc/stat, a window too short to resolve, unpaired runs)."""
    not_measured_why: str | None = None
    """Why the outcome is `not measured`: the figure and the protocol's limit it broke."""
    attempts: int = 1
    """Comparisons run for this answer, retries of a disturbed one included."""
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
        for `not measured`, why, and a finite interval only as one that decides nothing."""
        pct = f"{self.confidence:.0%}"
        if self.outcome == NOT_MEASURED:
            why = self.not_measured_why or "no figure may decide"
            line = f"{candidate} against {baseline} was not measured: {why} ({self.rounds} rounds{self._how()})"
            if self.finite:
                interval = f"{pct} CI {self.ci_low:.2f}-{self.ci_high:.2f}"
                line += f"; its time ratio {self.ratio:.2f} ({interval}) decides nothing"
            return line
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
        parts = [] if self.paired else ["unpaired"]
        if self.stopped not in ("interval", "samples"):
            parts.append(f"stopped at {self.stopped}")
        if self.load_before is not None:
            parts.append(f"load {self.load_before:.1f}")
        if self.foreign_cores is not None:
            parts.append(f"other processes {self.foreign_cores:.2f} cores")
        if self.attempts > 1:
            parts.append(f"attempt {self.attempts}")
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


def _result(mean, lo, hi, cand, base, protocol, stopped, *, paired, **machine) -> Comparison:
    """The Comparison of a log-ratio estimate `mean` with its interval [lo, hi]; `not measured` when
    the interval is not finite or rests on fewer than 2 rounds. `machine`: load_before, load_after,
    foreign_cores, attempts."""
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
        paired=paired,
        candidate_times_s=list(cand),
        baseline_times_s=list(base),
        **machine,
    )
    if rounds < 2:
        c.outcome, c.not_measured_why = NOT_MEASURED, f"{rounds} kept round(s): an interval needs at least 2"
    elif not c.finite:
        c.outcome, c.not_measured_why = NOT_MEASURED, f"the interval ({c.ci_low:.3g}-{c.ci_high:.3g}) is not finite"
    return c


def _disturbance(before: LoadSnapshot, after: LoadSnapshot, foreign: float | None, p: TimingProtocol) -> str | None:
    """What disturbed a comparison between the two snapshots, against the protocol's limits; None: nothing."""
    why = []
    if foreign is not None and foreign > p.max_foreign_cores:
        why.append(f"another process held {foreign:.2f} cores on average (limit {p.max_foreign_cores:g})")
    if before.load_1m is not None and after.load_1m is not None:
        change = after.load_1m - before.load_1m
        beyond_own = change - cpu_load.load_rise_own_bound(before, after)
        if beyond_own > p.max_load_change:
            why.append(f"the 1-minute load average rose {before.load_1m:.2f} -> {after.load_1m:.2f}, {beyond_own:.2f} "
                       f"more than this process's own threads explain (limit {p.max_load_change:g})")  # fmt: skip
        elif change < -p.max_load_change:
            why.append(f"the 1-minute load average fell {before.load_1m:.2f} -> {after.load_1m:.2f} "
                       f"(limit {p.max_load_change:g})")  # fmt: skip
    return "; ".join(why) or None


def compare(
    candidate: Callable[[], float],
    baseline: Callable[[], float],
    protocol: TimingProtocol | None = None,
    *,
    clock: Callable[[], float] = time.perf_counter,
    probe: Callable[[], LoadSnapshot] = cpu_load.snapshot,
) -> Comparison:
    """Time `candidate` against `baseline` interleaved until the ratio is known well enough.

    Each callable runs one sample (e.g. one training step, synchronised) and returns its
    duration in seconds (`timed` makes one from a function). `clock` measures only the
    wall-clock cap, so a test can script both the samples and the time; `probe` snapshots the
    machine around each attempt (`cpu_load.snapshot`), so a test can script its load too.
    """
    p = protocol or TimingProtocol()
    for attempt in range(1, p.retries_when_disturbed + 2):
        before = probe()
        estimate = _rounds(candidate, baseline, p, clock)
        after = probe()
        foreign = cpu_load.foreign_cores(before, after)
        disturbed = _disturbance(before, after, foreign, p)
        if disturbed is None:
            break
    mean, lo, hi, cand, base, stopped = estimate
    c = _result(mean, lo, hi, cand, base, p, stopped, paired=True, load_before=before.load_1m,
                load_after=after.load_1m, foreign_cores=foreign, attempts=attempt)  # fmt: skip
    if disturbed is not None:
        every = f", as in each of the {attempt} attempts" if attempt > 1 else ""
        c.outcome = NOT_MEASURED
        c.not_measured_why = "; ".join(w for w in (disturbed + every, c.not_measured_why) if w)
    return c


def _rounds(candidate, baseline, p: TimingProtocol, clock) -> tuple:
    """One comparison's interleaved rounds: (mean, low, high, candidate times, baseline times, stopped)."""
    start = clock()
    cand: list[float] = []
    base: list[float] = []
    logs: list[float] = []
    stopped = "max_rounds"
    for i in range(p.warmup + p.max_rounds):
        # A B, then B A: each candidate goes first half of the time
        if i % 2 == 0:
            c, b = candidate(), baseline()
        else:
            b = baseline()
            c = candidate()
        if i < p.warmup:
            continue
        if c <= 0 or b <= 0:
            raise ValueError(f"a timed sample must be positive seconds, got candidate {c}, baseline {b}")
        cand.append(c)
        base.append(b)
        logs.append(math.log(c / b))
        if len(logs) >= p.min_rounds:
            _, lo, hi = _interval(logs, p.confidence)
            if (hi - lo) / 2 <= math.log1p(p.ci_half_width):
                stopped = "interval"
                break
        if clock() - start > p.max_seconds and len(logs) >= 2:
            stopped = "max_seconds"
            break
    return (*_interval(logs, p.confidence), cand, base, stopped)


def compare_samples(
    candidate_times: list[float], baseline_times: list[float], protocol: TimingProtocol | None = None
) -> Comparison | None:
    """The same answer for two runs timed apart: Welch's interval on the mean log times.

    None when either side has fewer than two samples (no interval can be had); `not measured`
    when the interval is not finite. The machine was not watched: no load, no retry.
    """
    p = protocol or TimingProtocol()
    a = [math.log(t) for t in candidate_times if t > 0]
    b = [math.log(t) for t in baseline_times if t > 0]
    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    mean = statistics.fmean(a) - statistics.fmean(b)
    se = math.sqrt(va + vb)
    # Welch-Satterthwaite degrees of freedom
    df = (
        max(1, int((va + vb) ** 2 / ((va**2 / (len(a) - 1)) + (vb**2 / (len(b) - 1)))))
        if se > 0
        else len(a) + len(b) - 2
    )
    half = t_quantile(0.5 + p.confidence / 2, df) * se
    return _result(mean, mean - half, mean + half, candidate_times, baseline_times, p, "samples", paired=False)


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
