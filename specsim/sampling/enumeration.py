"""Exact enumeration of a verifier callable's step (torch).

A verifier is deterministic given the uniforms it is handed. For one draft path its output is a
function f(u_1..u_k, s) of the k accept uniforms and the one sample uniform, constant on pieces
cut by thresholds (an accept test) and by a distribution's cumulative sums (a sampled token). So
the step's exact output distribution is a finite sum once every cut is found:

1. every draft path from the prompt with its drafter probability is a *case*;
2. along each uniform, f is scanned on a grid and every change of output is bisected down to
   adjacent float64 numbers; the scan anchors on every piece of the other accept uniforms found
   so far, until no new cut appears;
3. f is evaluated at the centre of every cell of the product of the cuts, each weighted by its
   volume, and again at a seeded random point of every cell: a disagreement is bisected into a
   new cut and the grid refined, so a result is only returned for a grid on which f is constant
   wherever it was probed.

The cuts are exact to one float64 step, so the distribution is exact to about 1e-15 per cut.
What it cannot see: a piece narrower than a scan interval whose neighbours on both sides give
the same output (a verifier that returns to an earlier output along one uniform; thresholds and
inverse-CDF sampling in any token order never do). A verifier whose output differs when called
twice on the same inputs (it draws its own random numbers) has no enumeration; nor has one whose
grid grows past ``MAX_EVALUATIONS``. The step starts from the prompt and is judged over the whole
window of k + 1 tokens, continued by the target (``reference.first_step_window``). ``Probe``
takes any step that maps a case and its uniforms to tokens: ``tree_enumeration`` enumerates a
tree verifier's step with it (a case is then a whole drafted tree, the axes one per node).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from specsim.sampling import reference
from specsim.sampling.harness import Malformed, VerifierTables, call_verifier
from specsim.sampling.randomness import VerifierRandomness

SCAN_POINTS = 16  # intervals per uniform in a scan
MAX_ROUNDS = 8  # discovery + refinement rounds before giving up
MAX_EVALUATIONS = 40_000_000  # verifier rows; beyond this the enumeration is declined
CHUNK_ROWS = 1 << 16
BELOW_ONE = float(np.nextafter(1.0, 0.0))


@dataclass(frozen=True)
class Enumerated:
    """The enumerated window (or why there is none) and what it cost."""

    window: np.ndarray | None  # [V]*(k+1); None when the enumeration was not possible
    cases: int
    evaluations: int
    note: str | None = None  # why there is no window
    malformed: Malformed | None = None


class _Declined(Exception):
    def __init__(self, note: str, malformed: Malformed | None = None):
        super().__init__(note)
        self.note, self.malformed = note, malformed


def enumerate_step(
    verifier: Callable,
    tables: VerifierTables,
    prompt: tuple[int, int],
    k: int,
    draft_counts: tuple[int, ...],
    *,
    p_table: np.ndarray,
    greedy_reference: bool = False,
    seed: int = 0,
) -> Enumerated:
    """The exact first-(k+1)-token distribution of one step of ``verifier`` from ``prompt``,
    continued by the target (``p_table``, float64, or its argmax with ``greedy_reference``)."""
    cases = _Cases.from_prompt(tables, prompt, k, draft_counts)
    context = torch.tensor(prompt, dtype=torch.long)

    def call(case: np.ndarray, randomness: VerifierRandomness):
        return call_verifier(
            verifier, tables, context.expand(len(case), 2),
            torch.from_numpy(cases.drafts[case]), torch.from_numpy(cases.n_drafts[case]),
            randomness,
        )  # fmt: skip

    probe = Probe(cases.weights, k, k + 1, tables.vocab, call)
    return enumerate_probe(probe, p_table, prompt, greedy_reference, seed)


def enumerate_probe(
    probe: Probe,
    p_table: np.ndarray,
    prompt: tuple[int, int],
    greedy_reference: bool = False,
    seed: int = 0,
) -> Enumerated:
    """The exact window of the step ``probe`` calls (any step that maps one case and its uniforms
    to emitted tokens: a chain's or a tree's), continued by the target."""
    rng = np.random.default_rng(seed)
    try:
        _require_determinism(probe, probe.axes, rng)
        cuts = _discover(probe, probe.axes)
        step = _integrate(probe, cuts, probe.axes, rng)
    except _Declined as declined:
        return Enumerated(None, probe.count, probe.evaluations, declined.note, declined.malformed)
    window = reference.first_step_window(step, p_table, prompt, greedy_reference)
    return Enumerated(window, probe.count, probe.evaluations)


@dataclass(frozen=True)
class _Cases:
    """Every draft path from the prompt with positive drafter probability, per window size."""

    drafts: np.ndarray  # [C, k], -1 past the window
    n_drafts: np.ndarray  # [C]
    weights: np.ndarray  # [C]: P_q(path) / number of window sizes

    @property
    def count(self) -> int:
        return len(self.weights)

    @classmethod
    def from_prompt(cls, tables, prompt, k, draft_counts) -> _Cases:
        q = tables.q_draft.double().numpy()
        drafts, sizes, weights = [], [], []
        for n in draft_counts:
            paths = [((), 1.0, tuple(prompt))]
            for _ in range(n):
                paths = [
                    ((*path, x), weight * float(q[c[-2], c[-1], x]), (c[-1], x))
                    for path, weight, c in paths
                    for x in np.flatnonzero(q[c[-2], c[-1]] > 0).tolist()
                ]
            for path, weight, _ in paths:
                drafts.append(list(path) + [-1] * (k - n))
                sizes.append(n)
                weights.append(weight / len(draft_counts))
        return cls(
            np.array(drafts, dtype=np.int64).reshape(-1, k),
            np.array(sizes, dtype=np.int64),
            np.array(weights),
        )


class Probe:
    """Evaluates a step at (case, point) rows; an output is a code that is equal for two rows
    exactly when they emitted the same tokens.

    ``weights`` [C]: each case's probability; ``axes``: accept uniforms per row (a point is
    those, then the sample uniform); ``longest``: most tokens a step emits; ``call(case,
    randomness)``: (tokens [R, longest], -1 past each row's count; counts [R]) or ``Malformed``.
    """

    def __init__(self, weights: np.ndarray, axes: int, longest: int, vocab: int, call):
        self.weights, self.axes, self.longest, self.vocab = weights, axes, longest, vocab
        self.call = call
        self.base = vocab + 1
        self.evaluations = 0

    @property
    def count(self) -> int:
        return len(self.weights)

    def __call__(self, case: np.ndarray, points: np.ndarray) -> np.ndarray:
        if len(case) == 0:
            return np.zeros(0, dtype=np.int64)
        self.evaluations += len(case)
        if self.evaluations > MAX_EVALUATIONS:
            raise _Declined(
                f"the enumeration would take more than {MAX_EVALUATIONS:,} verifier rows; use a "
                "smaller --vocab, --k or tree for an exact result"
            )
        return np.concatenate(
            [
                self._codes(case[i : i + CHUNK_ROWS], points[i : i + CHUNK_ROWS])
                for i in range(0, len(case), CHUNK_ROWS)
            ]
        )

    def _codes(self, case: np.ndarray, points: np.ndarray) -> np.ndarray:
        points = torch.from_numpy(np.ascontiguousarray(points))
        randomness = VerifierRandomness(points[:, : self.axes], points[:, self.axes])
        out = self.call(case, randomness)
        if isinstance(out, Malformed):
            raise _Declined("the verifier's output breaks the contract", out)
        tokens, _ = out
        powers = self.base ** torch.arange(self.longest, dtype=torch.long)
        return ((tokens + 1) * powers).sum(dim=1).numpy()

    def decode(self, code: int) -> tuple[int, ...]:
        tokens = []
        while code:
            code, digit = divmod(code, self.base)
            tokens.append(digit - 1)
        return tuple(tokens)


NOT_DETERMINISTIC = (
    "the verifier gave different outputs for the same inputs and uniforms (does it draw its own "
    "random numbers?): no exact enumeration"
)


def _require_determinism(probe: Probe, k: int, rng: np.random.Generator) -> None:
    """Call the verifier twice on the same random rows (four per case)."""
    case = np.repeat(np.arange(probe.count), 4)
    points = rng.uniform(size=(len(case), k + 1))
    if not np.array_equal(probe(case, points), probe(case, points)):
        raise _Declined(NOT_DETERMINISTIC)


def _discover(probe: Probe, k: int) -> list[list[np.ndarray]]:
    """Cuts per axis (k accept uniforms, then the sample uniform) per case: scan each axis from
    every piece of the other accept axes found so far, until a round finds nothing new."""
    count = probe.count
    cuts = [[np.zeros(0) for _ in range(count)] for _ in range(k + 1)]
    for _ in range(MAX_ROUNDS):
        found = False
        for axis in range(k + 1):
            case, anchors = _anchors(cuts, axis, k)
            new = _scan(probe, case, anchors, axis)
            found |= _merge(cuts[axis], new)
        if not found:
            return cuts
    raise _Declined("the verifier's pieces did not settle: no exact enumeration")


def _anchors(cuts, axis: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Points [A, k+1] (and their cases) at the centre of every piece of the accept axes other
    than ``axis``; the sample uniform and ``axis`` itself sit at 0.5."""
    cases, points = [], []
    for c in range(len(cuts[0])):
        centres = [
            _centres(cuts[a][c]) if a != axis and a < k else np.array([0.5]) for a in range(k + 1)
        ]
        grid = np.array(list(itertools.product(*centres)))
        cases.append(np.full(len(grid), c))
        points.append(grid)
    return np.concatenate(cases), np.concatenate(points)


def _scan(probe, case, anchors, axis) -> dict[int, list[float]]:
    """Cuts along ``axis`` from each anchor: a scan, then bisection of every change."""
    steps = np.linspace(0.0, 1.0, SCAN_POINTS + 1)
    steps[-1] = BELOW_ONE
    rows = np.repeat(np.arange(len(case)), len(steps))
    points = anchors[rows].copy()
    points[:, axis] = np.tile(steps, len(case))
    codes = probe(case[rows], points).reshape(len(case), len(steps))
    change = codes[:, 1:] != codes[:, :-1]
    row, at = np.nonzero(change)
    lo, hi = steps[at], steps[at + 1]
    cut_rows, cut_values = _bisect(
        probe, case, anchors, axis, row, lo, hi, codes[row, at], codes[row, at + 1]
    )
    found: dict[int, list[float]] = {}
    for r, value in zip(cut_rows.tolist(), cut_values.tolist(), strict=True):
        found.setdefault(int(case[r]), []).append(value)
    return found


def _bisect(probe, case, anchors, axis, row, lo, hi, code_lo, code_hi):
    """Every change of output between lo and hi (whose outputs differ), down to adjacent floats.
    Returns (anchor row, first point of the new output) per cut."""
    done_rows, done_values = [], []
    while len(row):
        mid = lo + (hi - lo) / 2
        adjacent = (mid <= lo) | (mid >= hi)
        done_rows.append(row[adjacent])
        done_values.append(hi[adjacent])
        keep = ~adjacent
        row, lo, hi, mid = row[keep], lo[keep], hi[keep], mid[keep]
        code_lo, code_hi = code_lo[keep], code_hi[keep]
        points = anchors[row].copy()
        points[:, axis] = mid
        code_mid = probe(case[row], points)
        left, right = code_mid != code_lo, code_mid != code_hi
        row = np.concatenate([row[left], row[right]])
        lo, hi = np.concatenate([lo[left], mid[right]]), np.concatenate([mid[left], hi[right]])
        code_lo = np.concatenate([code_lo[left], code_mid[right]])
        code_hi = np.concatenate([code_mid[left], code_hi[right]])
    return np.concatenate(done_rows or [np.zeros(0, np.int64)]), np.concatenate(
        done_values or [np.zeros(0)]
    )


def _merge(axis_cuts: list[np.ndarray], new: dict[int, list[float]]) -> bool:
    changed = False
    for c, values in new.items():
        merged = np.union1d(axis_cuts[c], values)
        if len(merged) != len(axis_cuts[c]):
            axis_cuts[c], changed = merged, True
    return changed


def _centres(cuts: np.ndarray) -> np.ndarray:
    edges = np.concatenate([[0.0], cuts, [1.0]])
    return (edges[:-1] + edges[1:]) / 2


def _integrate(probe: Probe, cuts, k: int, rng: np.random.Generator) -> reference.Emitted:
    """Weight every cell's output by its volume; refine while a random point of a cell
    disagrees with its centre."""
    for _ in range(MAX_ROUNDS):
        case, centre, low, width = _cells(cuts, probe.count)
        codes = probe(case, centre)
        if not np.array_equal(probe(case[:4096], centre[:4096]), codes[:4096]):
            raise _Declined(NOT_DETERMINISTIC)
        inside = low + width * rng.uniform(0.05, 0.95, size=width.shape)
        volume = probe.weights[case] * width.prod(axis=1)
        # A piece of zero volume (u exactly 0 accepting where p'(x) = 0, as `u <= p/q` does)
        # carries no probability, and its centre cannot be told from its edge in float64.
        differ = np.flatnonzero((probe(case, inside) != codes) & (volume > 0))
        if len(differ) == 0:
            return _emitted(probe, codes, volume)
        _refine(probe, cuts, case[differ], centre[differ], inside[differ])
    raise _Declined(
        "the verifier's output is not constant on the pieces found (no product of cuts along "
        "each uniform describes it): no exact enumeration"
    )


def _cells(cuts, count: int):
    """Every cell of every case's grid: (case, centre, lower corner, widths)."""
    cases, centres, lows, widths = [], [], [], []
    for c in range(count):
        edges = [np.concatenate([[0.0], axis[c], [1.0]]) for axis in cuts]
        lower = [e[:-1] for e in edges]
        size = [np.diff(e) for e in edges]
        low = np.array(list(itertools.product(*lower)))
        width = np.array(list(itertools.product(*size)))
        cases.append(np.full(len(low), c))
        lows.append(low)
        widths.append(width)
        centres.append(low + width / 2)
    return (np.concatenate(cases), np.concatenate(centres), np.concatenate(lows),
            np.concatenate(widths))  # fmt: skip


def _refine(probe, cuts, case, start, end) -> None:
    """Walk from each centre to its disagreeing point one axis at a time; bisect the axis where
    the output first changes into a new cut."""
    axes = start.shape[1]
    chain = np.repeat(start[:, None, :], axes + 1, axis=1)
    for a in range(axes):
        chain[:, a + 1 :, a] = end[:, None, a]
    codes = probe(np.repeat(case, axes + 1), chain.reshape(-1, axes)).reshape(len(case), axes + 1)
    for a in range(axes):
        changes = np.flatnonzero(codes[:, a] != codes[:, a + 1])
        if len(changes) == 0:
            continue
        lo = np.minimum(start[changes, a], end[changes, a])
        hi = np.maximum(start[changes, a], end[changes, a])
        at_lo = np.where(
            start[changes, a] <= end[changes, a], codes[changes, a], codes[changes, a + 1]
        )
        at_hi = np.where(
            start[changes, a] <= end[changes, a], codes[changes, a + 1], codes[changes, a]
        )
        anchors = chain[changes, a]
        rows, values = _bisect(
            probe, case[changes], anchors, a, np.arange(len(changes)), lo, hi, at_lo, at_hi
        )
        new: dict[int, list[float]] = {}
        for r, value in zip(rows.tolist(), values.tolist(), strict=True):
            new.setdefault(int(case[changes][r]), []).append(value)
        _merge(cuts[a], new)


def _emitted(probe: Probe, codes: np.ndarray, volume: np.ndarray) -> reference.Emitted:
    """Sum the cells' probabilities per emitted sequence into the reference's step form."""
    vocab, longest = probe.vocab, probe.longest
    unique, inverse = np.unique(codes, return_inverse=True)
    mass = np.bincount(inverse, weights=volume, minlength=len(unique))
    exact = [np.zeros((vocab,) * length) for length in range(1, longest)]
    at_least = np.zeros((vocab,) * longest)
    for code, probability in zip(unique.tolist(), mass.tolist(), strict=True):
        tokens = probe.decode(code)
        if len(tokens) == longest:
            at_least[tokens] += probability
        else:
            exact[len(tokens) - 1][tokens] += probability
    return reference.Emitted(exact, at_least, longest)
