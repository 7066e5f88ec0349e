"""One timing protocol for every "which is faster?" question, with the noise in view.

A single timed step on a shared machine is not evidence: the same step measured 0.083 s
and 0.137 s in one run here. So every keep/choose decision (a kernel, an execution mode,
a batch size, a flag) and every benchmark ratio goes through `compare`:

- the two candidates run interleaved, A B B A A B ..., so drift in the machine's load
  falls on both alike;
- the first `warmup` rounds are discarded (caches, allocator, lazy compilation);
- each round gives one paired ratio candidate / baseline; the estimate is their
  geometric mean, with a Student-t interval on the mean of the log ratios;
- rounds go on until the interval is narrower than `ci_half_width` on either side, or
  a cap (`max_rounds`, `max_seconds`) is reached;
- the outcome is `slower` or `faster` only when the interval excludes 1 *and* the
  estimate is beyond `min_effect`; otherwise `indistinguishable`, and the caller keeps
  the simpler choice.

`ratio` is always candidate time / baseline time: above 1 the candidate is slower.
`compare_samples` applies the same statistics to two runs timed apart (unpaired), for
putting one run's step times beside another's; it says `paired: false` and is wider.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import lru_cache


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

    def __post_init__(self):
        if self.min_rounds < 2 or self.max_rounds < self.min_rounds or self.warmup < 0:
            raise ValueError(f"timing protocol needs 2 <= min_rounds <= max_rounds and warmup >= 0: {self}")
        if not (0 < self.confidence < 1) or self.ci_half_width <= 0 or self.min_effect < 0:
            raise ValueError(f"timing protocol needs 0 < confidence < 1, ci_half_width > 0, min_effect >= 0: {self}")

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
    """faster | slower | indistinguishable (the candidate, against the baseline)."""
    ratio: float
    """Candidate time / baseline time (geometric mean of the paired ratios)."""
    ci_low: float
    ci_high: float
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
    candidate_times_s: list[float] = field(default_factory=list)
    baseline_times_s: list[float] = field(default_factory=list)

    @property
    def speedup(self) -> float:
        """Baseline time / candidate time: above 1 the candidate is faster."""
        return 1.0 / self.ratio

    def describe(self, candidate: str = "candidate", baseline: str = "baseline") -> str:
        """One line with the interval, e.g. 'fused_ce is 1.42x faster than plain (99% CI 1.35-1.50x, 12 rounds)'."""
        pct = f"{self.confidence:.0%}"
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
        """A table cell: speed-up of the candidate with its interval, e.g. '1.29x (1.21-1.38)', or '~1 (0.93-1.08)'."""
        lo, hi = 1 / self.ci_high, 1 / self.ci_low
        head = "~1" if self.outcome == "indistinguishable" else f"{self.speedup:.2f}x"
        return f"{head} ({lo:.2f}-{hi:.2f})"

    def _how(self) -> str:
        parts = [] if self.paired else ["unpaired"]
        if self.stopped not in ("interval", "samples"):
            parts.append(f"stopped at {self.stopped}")
        if self.load_before is not None:
            parts.append(f"load {self.load_before:.1f}")
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


def _load() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def _result(mean, lo, hi, cand, base, protocol, stopped, *, paired, load_before=None) -> Comparison:
    """The Comparison of a log-ratio estimate `mean` with its interval [lo, hi]."""
    return Comparison(
        outcome=_outcome(mean, lo, hi, protocol),
        ratio=math.exp(mean),
        ci_low=math.exp(lo),
        ci_high=math.exp(hi),
        confidence=protocol.confidence,
        rounds=min(len(cand), len(base)),
        stopped=stopped,
        candidate_median_s=statistics.median(cand),
        baseline_median_s=statistics.median(base),
        paired=paired,
        load_before=load_before,
        load_after=_load() if paired else None,
        candidate_times_s=list(cand),
        baseline_times_s=list(base),
    )


def compare(
    candidate: Callable[[], float],
    baseline: Callable[[], float],
    protocol: TimingProtocol | None = None,
    *,
    clock: Callable[[], float] = time.perf_counter,
) -> Comparison:
    """Time `candidate` against `baseline` interleaved until the ratio is known well enough.

    Each callable runs one sample (e.g. one training step, synchronised) and returns its
    duration in seconds (`timed` makes one from a function). `clock` measures only the
    wall-clock cap, so a test can script both the samples and the time.
    """
    p = protocol or TimingProtocol()
    load_before = _load()
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
    return _result(*_interval(logs, p.confidence), cand, base, p, stopped, paired=True, load_before=load_before)


def compare_samples(
    candidate_times: list[float], baseline_times: list[float], protocol: TimingProtocol | None = None
) -> Comparison | None:
    """The same answer for two runs timed apart: Welch's interval on the mean log times.

    None when either side has fewer than two samples (no interval can be had).
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
