"""planner.py - the decisions of the heterogeneous planner, as pure functions of
measured numbers: no torch.distributed, no clock, so that a test can drive
them with made-up figures (hetero.py measures and applies them).

The model. Rank r takes t_r(b) = a_r + b * c_r seconds per step at a batch of
b samples (a StepCurve: forward, backward and whatever else the rank does per
step, fitted from timings at two or more batch sizes). A step of the ranks S
with shares b_r (summing to the global batch B) takes

    T(S) = max over r in S of t_r(b_r)  +  X(S)

where X(S) is the gradient exchange among S, measured whole on those ranks (an
all_reduce of the model's gradients in DDP's bucket sizes) and counted as not
hidden behind backward: an upper bound, so where it errs it errs towards
leaving a rank out. X of one rank is 0: it exchanges nothing. The shares of S
are those that make t_r(b_r) equal (the ranks finish together), and the plan
takes the S that maximises B / T(S) among the prefixes of the ranks ordered
fastest first, a larger S only where it is predicted at least `min_gain`
faster than the best smaller one.
"""
import math
from dataclasses import dataclass, field

__all__ = ["StepCurve", "Decision", "decide", "equalize", "speed_order", "predict", "scale", "rescale"]


@dataclass(frozen=True)
class StepCurve:
    """t(b) = a + b * c seconds for a step of b samples (a >= 0, c > 0)."""
    a: float
    c: float

    def time(self, b):
        return self.a + b * self.c

    def rate(self, b):
        """Samples per second at a batch of b (0 for b = 0)."""
        return b / self.time(b) if b > 0 else 0.0

    @staticmethod
    def fit(points):
        """The least-squares line through [(batch, seconds), ...], kept
        physical: the fixed part a is never negative (else the line through the
        origin) and the per-sample part c is positive (else a flat line at the
        mean time with a per-sample part 1e-6 of it). One point, or one batch
        size: the line through the origin (samples/s constant)."""
        pts = [(float(b), float(t)) for b, t in points if b > 0 and t > 0 and math.isfinite(t)]
        if not pts:
            raise ValueError(f"StepCurve.fit: no usable (batch > 0, seconds > 0) point in {points}")
        n = len(pts)
        mb = sum(b for b, _ in pts) / n
        mt = sum(t for _, t in pts) / n
        sbb = sum((b - mb) ** 2 for b, _ in pts)
        if sbb > 0:
            c = sum((b - mb) * (t - mt) for b, t in pts) / sbb
            a = mt - c * mb
            if c <= 0:
                return StepCurve(mt, mt * 1e-6 / max(b for b, _ in pts))
            if a >= 0:
                return StepCurve(a, c)
        c = sum(b * t for b, t in pts) / sum(b * b for b, _ in pts)
        return StepCurve(0.0, c)


def speed_order(curves, total):
    """Ranks fastest first: by their step time at an even share of `total`
    (ties: lower rank first)."""
    even = total / len(curves)
    return sorted(range(len(curves)), key=lambda r: (curves[r].time(even), r))


def equalize(curves, ranks, total):
    """Integer shares of `total` samples for `ranks` (a list of indices into
    curves) that minimise the largest t_r(b_r): the continuous solution (every
    rank with b_r > 0 finishing at the same time, found by bisection), rounded
    down, the samples left given one at a time to the rank that would finish
    first with one more (ties: lower rank). Returns {rank: share}."""
    ranks = list(ranks)
    if total <= 0:
        return {r: 0 for r in ranks}

    def placed(t):
        return sum(max(0.0, (t - curves[r].a) / curves[r].c) for r in ranks)

    lo = min(curves[r].a for r in ranks)
    hi = max(curves[r].time(total) for r in ranks)
    for _ in range(100):
        mid = (lo + hi) / 2
        if placed(mid) < total:
            lo = mid
        else:
            hi = mid
    out = {r: int(math.floor(max(0.0, (hi - curves[r].a) / curves[r].c))) for r in ranks}
    over = sum(out.values()) - total
    while over > 0:  # the bisection's rounding gave one too many somewhere
        r = max((r for r in ranks if out[r] > 0), key=lambda r: (curves[r].time(out[r]), r))
        out[r] -= 1
        over -= 1
    for _ in range(total - sum(out.values())):
        r = min(ranks, key=lambda r: (curves[r].time(out[r] + 1), r))
        out[r] += 1
    return out


@dataclass
class Option:
    """One set of ranks considered: its shares and predicted step."""
    ranks: tuple
    shares: list          # one per rank of the job, 0 outside `ranks`
    compute: float        # max over ranks of t_r(b_r), seconds
    exchange: float       # X(ranks), seconds
    step: float = field(init=False)
    rate: float = field(init=False)

    def __post_init__(self):
        self.step = self.compute + self.exchange
        self.rate = sum(self.shares) / self.step if self.step > 0 else math.inf


@dataclass
class Decision:
    """What decide() chose (`chosen`), and every option it weighed."""
    total: int
    curves: list
    options: list
    chosen: Option

    @property
    def active(self):
        return sorted(self.chosen.ranks)

    @property
    def shares(self):
        return list(self.chosen.shares)

    @property
    def left_out(self):
        return [r for r in range(len(self.curves)) if r not in self.chosen.ranks]

    def solo(self):
        """(rank, samples/s) of the fastest rank alone on the whole batch."""
        return max(((r, c.rate(self.total)) for r, c in enumerate(self.curves)),
                   key=lambda x: (x[1], -x[0]))

    def describe(self, devices=None):
        """The verdict in words a user can act on (one paragraph)."""
        p = len(self.curves)
        dev = (lambda r: f" ({devices[r]})") if devices else (lambda r: "")
        best, best_rate = self.solo()
        full = next((o for o in self.options if len(o.ranks) == p), None)
        ch = self.chosen
        head = f"plan for a global batch of {self.total} on {p} rank{'s' * (p != 1)}: "
        if len(self.active) == 1:
            head += f"rank {self.active[0]}{dev(self.active[0])} takes all of it"
        else:
            head += (f"ranks {_ranks(self.active)} share it "
                     f"{':'.join(str(ch.shares[r]) for r in self.active)}")
        lines = [head]
        if self.left_out:
            kinds = sorted({devices[r] for r in self.left_out}) if devices else []
            lines.append(f"rank{'s' * (len(self.left_out) != 1)} {_ranks(self.left_out)}"
                         f"{' (' + ', '.join(kinds) + ')' if kinds else ''} left out: with "
                         f"{'them' if len(self.left_out) > 1 else 'it'} the job is predicted at "
                         f"{full.rate / best_rate:.2f}x of rank {best}{dev(best)} alone, without "
                         f"{ch.rate / best_rate:.2f}x" if full else
                         f"ranks {_ranks(self.left_out)} left out")
        lines.append(f"predicted {ch.rate:,.0f} samples/s (step {ch.step * 1e3:.2f} ms: compute "
                     f"{ch.compute * 1e3:.2f} + gradient exchange {ch.exchange * 1e3:.2f}); rank "
                     f"{best}{dev(best)} alone {best_rate:,.0f} samples/s ({ch.rate / best_rate:.2f}x)")
        return "; ".join(lines)


def _ranks(rs):
    return ", ".join(str(r) for r in rs)


def decide(curves, total, exchange=None, order=None, min_gain=0.10, allowed=None):
    """The plan for a global batch of `total` samples over ranks with step-time
    `curves` (one StepCurve per rank).

    exchange: {tuple of sorted ranks: seconds} for the sets measured (a set of
    one rank costs 0 and need not be given); None: no exchange cost, every
    rank is used. order: the ranks fastest first (default speed_order); the
    sets weighed are its prefixes for which exchange has a figure. allowed:
    restrict the plan to these ranks (rebalancing among the ranks already
    chosen). Returns a Decision."""
    p = len(curves)
    if p == 0:
        raise ValueError("decide: no rank")
    if int(total) != total or total < 1:
        raise ValueError(f"decide: the global batch must be a positive integer, not {total!r}")
    total = int(total)
    if order is None:
        order = speed_order(curves, total)
    sizes = range(1, len(order) + 1)
    if allowed is not None:
        order = [r for r in order if r in set(allowed)]
        sizes = [len(order)]
    options = []
    for k in sizes:
        ranks = tuple(sorted(order[:k]))
        if k == 1 or exchange is None:
            x = 0.0
        elif ranks in exchange:
            x = float(exchange[ranks])
        elif allowed is not None:
            x = 0.0  # the set is given: its exchange only shifts the prediction
        else:
            continue
        sh = equalize(curves, ranks, total)
        shares = [sh.get(r, 0) for r in range(p)]
        compute = max(curves[r].time(sh[r]) for r in ranks)
        options.append(Option(ranks, shares, compute, x))
    if exchange is None or allowed is not None:
        chosen = options[-1]
    else:
        chosen = options[0]
        for o in options[1:]:
            if o.rate > chosen.rate * (1 + min_gain):
                chosen = o
    return Decision(total, list(curves), options, chosen)


def predict(curves, shares, exchange=0.0):
    """The predicted step (seconds) of the ranks with a share > 0 at these
    shares: the slowest rank's t_r(b_r) plus the exchange given."""
    used = [r for r, b in enumerate(shares) if b > 0]
    if not used:
        raise ValueError(f"predict: no rank has a share in {shares}")
    return max(curves[r].time(shares[r]) for r in used) + (exchange if len(used) > 1 else 0.0)


def scale(curves, factors):
    """Rank r's curve with a and c multiplied by factors[r] (None: unchanged)."""
    return [c if f is None else StepCurve(c.a * f, c.c * f) for c, f in zip(curves, factors)]


def rescale(curves, batches, busy):
    """Curves moved through what was observed: rank r's curve scaled by
    busy[r] / t_r(batches[r]), its observed step time over the predicted one.
    Ranks without an observation (busy None, or a batch of 0) keep theirs."""
    return scale(curves, [None if t is None or not b or not math.isfinite(t) or t <= 0
                          else t / c.time(b) for c, b, t in zip(curves, batches, busy)])
