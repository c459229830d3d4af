"""Acceptance entries from what the engines report: counters per position, or one scalar.

- Per position (vLLM's ``spec_decode_*`` deltas): the runs of one window k are pooled (their
  per-position counts and drafts summed), and vLLM's *unconditional* rates u_i (the share of
  steps whose first i drafts were all accepted) become the profile's *conditional* ones,
  a_1 = u_1 and a_i = u_i / u_(i-1); a position no step reached gets 0.
- A scalar (SGLang's ``accept_length``, a dashboard's mean acceptance length L or acceptance
  rate R = accepted / drafted = (L - 1) / k, per drafter and k, from a run or from
  ``--acceptance-length`` / ``--acceptance-rate``): the constant conditional rate a with
  a + a^2 + ... + a^k = L - 1 (``SCALAR_RULE``). Every output that uses it says so.
- ``mean_acceptance_length`` holds each measured window's own length, and every other window
  from 1 up to the widest is filled from the widest window's chain: the simulator then chains
  the rates that give every measured window exactly its measured length
  (``specsim.simulation.acceptance.window_rates``), where the widest window's rates alone would
  misstate a narrower one. ``per_position`` comes from the widest window with per-position
  counts, else from the scalar rule at the widest window.
- ``proposal_rate`` and ``request_concentration`` are not in any engine's report: they are kept
  from the prior's entry (or left out).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from scipy.optimize import brentq

from specsim.bounds import MAX_K
from specsim.errors import SpecsimError
from specsim.profiling.writer import chain_mean_acceptance_lengths
from specsim.serving.runs import BenchRun

SCALAR_RULE = (
    "a scalar mean acceptance length L at window k (or a rate R = (L - 1) / k) is turned into "
    "per-position rates by one constant conditional rate a with a + a^2 + ... + a^k = L - 1"
)


@dataclass(frozen=True)
class Scalar:
    """One mean acceptance length known for a drafter at window k, and where it came from."""

    drafter: str
    k: int
    length: float
    origin: str  # "--acceptance-length", "--acceptance-rate" or a run


@dataclass
class Window:
    """What is known of one drafter's acceptance at one window k."""

    k: int
    drafts: float = 0.0  # steps counted, with the tokens they accepted
    accepted: float = 0.0
    draft_tokens: float = 0.0
    position_drafts: float = 0.0  # steps counted per position, with their counts
    positions: list[float] = field(default_factory=list)
    scalars: list[Scalar] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)

    @property
    def counted(self) -> bool:
        return self.drafts > 0

    @property
    def length(self) -> float:
        """1 + accepted / drafts over the counted runs, else the scalars' mean."""
        if self.counted:
            return 1.0 + self.accepted / self.drafts
        return sum(s.length for s in self.scalars) / len(self.scalars)

    def conditional(self) -> list[float]:
        rates, previous = [], 1.0
        for count in self.positions:
            u = count / self.position_drafts
            rates.append(0.0 if previous <= 0 else min(max(u / previous, 0.0), 1.0))
            previous = u
        return rates


def constant_rate(length: float, k: int) -> float:
    """The conditional rate a with a + a^2 + ... + a^k = length - 1 (0 <= a <= 1)."""
    target = min(max(length - 1.0, 0.0), float(k))
    if target <= 0.0:
        return 0.0
    if target >= k:
        return 1.0
    return float(brentq(lambda a: sum(a**i for i in range(1, k + 1)) - target, 0.0, 1.0))


def run_k(run: BenchRun, fallback: int | None) -> int:
    """The window of a speculative run: what its file says, else ``--k``."""
    k = run.speculation.k or fallback
    if k is None:
        raise SpecsimError(
            "a speculative run whose file does not say how many tokens were drafted per step",
            file=run.where,
            key="k",
            fix="give the window with --k K (vLLM's num_speculative_tokens, SGLang's "
            "speculative_num_steps)",
        )
    return k


def windows_from_runs(runs: Iterable[BenchRun], k_fallback: int | None) -> dict[int, Window]:
    """Each window's pooled counters (sums over its runs), or its scalars, from the runs."""
    windows: dict[int, Window] = {}
    for run in runs:
        spec = run.speculation
        k = run_k(run, k_fallback)
        window = windows.setdefault(k, Window(k, positions=[0.0] * k))
        window.runs.append(run.where)
        if spec.per_position and len(spec.per_position) != k:
            raise SpecsimError(
                f"{len(spec.per_position)} per-position rates for a window of {k}",
                file=run.where,
                key="k",
                fix="give --k only for runs whose files do not state the window",
            )
        if spec.num_drafts and spec.accepted_tokens is not None:
            window.drafts += spec.num_drafts
            window.accepted += spec.accepted_tokens
            window.draft_tokens += spec.draft_tokens or 0
            if spec.per_position:
                window.position_drafts += spec.num_drafts
                for i, rate in enumerate(spec.per_position):
                    window.positions[i] += rate * spec.num_drafts
            continue
        length = spec.acceptance_length
        if length is None:
            length = 1.0 + k * spec.acceptance_rate
        window.scalars.append(Scalar("", k, length, run.where))
    return windows


def parse_scalar(text: str, option: str, drafters: Iterable[str]) -> Scalar:
    """``NAME:K=VALUE`` from ``--acceptance-length`` (a length) or ``--acceptance-rate``."""
    is_length = option == "--acceptance-length"
    fix = f"write {option} NAME:K=VALUE, e.g. {option} ngram:3={'2.1' if is_length else '0.4'}"
    name, _, rest = text.partition(":")
    k_text, sep, value_text = rest.partition("=")
    try:
        k, value = int(k_text), float(value_text)
    except ValueError:
        k = value = None
    if not name or not sep or k is None or value != value:  # value != value: NaN
        raise SpecsimError(f"{text!r} is not NAME:K=VALUE", file=option, fix=fix)
    known = sorted(drafters)
    if name not in known:
        raise SpecsimError(
            f"{name!r} is not a drafter of the --into profile (it has: {', '.join(known)})",
            file=option,
            fix="name one of the profile's drafters",
        )
    if not 1 <= k <= MAX_K:
        raise SpecsimError(f"k = {k} is outside 1..{MAX_K}", file=option, fix=fix)
    low, high = (1.0, k + 1.0) if is_length else (0.0, 1.0)
    if not low <= value <= high:
        what = "a length (bonus token included)" if is_length else "a rate"
        raise SpecsimError(
            f"{value:g} is outside [{low:g}, {high:g}] for {what} at k = {k}",
            file=option,
            fix=fix,
        )
    return Scalar(name, k, value if is_length else 1.0 + k * value, option)


def add_scalars(windows: dict[int, Window], scalars: Iterable[Scalar], drafter: str) -> None:
    """The command line's scalars for ``drafter``, at windows no run measured."""
    for scalar in scalars:
        if scalar.drafter != drafter:
            continue
        window = windows.setdefault(scalar.k, Window(scalar.k, positions=[0.0] * scalar.k))
        if window.runs:
            raise SpecsimError(
                f"{drafter}:{scalar.k} given, but the benchmark runs report acceptance at "
                f"k = {scalar.k} for {drafter} ({window.runs[0]})",
                file=scalar.origin,
                fix="give a scalar only for a drafter and window no run measured",
            )
        window.scalars.append(scalar)


def acceptance_entry(
    drafter: str,
    verifier: str,
    temperature: float,
    windows: Mapping[int, Window],
    prior: Mapping | None,
) -> tuple[dict, dict]:
    """The profile's acceptance entry from ``windows``, and its description for the report."""
    ks = sorted(windows)
    positional = [k for k in ks if windows[k].position_drafts > 0]
    if positional:
        widest = windows[positional[-1]]
        per_position = widest.conditional()
    else:
        widest = windows[ks[-1]]
        per_position = [constant_rate(widest.length, widest.k)] * widest.k
    lengths = {k: windows[k].length for k in ks}
    chain = chain_mean_acceptance_lengths(per_position, 1.0, max(ks))
    filled = [k for k in range(1, ks[-1] + 1) if k not in lengths]
    lengths.update({k: chain[k] for k in filled})
    entry = {
        "drafter": drafter,
        "verifier": verifier,
        "temperature": temperature,
        "per_position": per_position,
        "mean_acceptance_length": dict(sorted(lengths.items())),
        "source": "calibrated",
    }
    for key in ("proposal_rate", "request_concentration"):
        if prior is not None and prior.get(key) is not None:
            entry[key] = prior[key]
    tokens = sum(w.draft_tokens for w in windows.values())
    if tokens:
        entry["tokens_scored"] = int(tokens)
    scalars = [k for k in ks if not windows[k].counted]
    if not positional and widest.k not in scalars:
        scalars.append(widest.k)  # counted totals, but no per-position counts: the rule
    described = {
        "drafter": drafter,
        "verifier": verifier,
        "temperature": temperature,
        "per_position": per_position,
        "per_position_from": f"k = {widest.k}, "
        + ("counted per position" if positional else "from a scalar by the rule"),
        "mean_acceptance_length": entry["mean_acceptance_length"],
        "windows": {
            k: {
                "from": "counters" if windows[k].counted else "scalar",
                "origin": windows[k].runs or [s.origin for s in windows[k].scalars],
            }
            for k in ks
        },
        "filled_from_chain": filled,
        "from_scalar": sorted(scalars),
        "rule": SCALAR_RULE if scalars else None,
        "kept_from_prior": [k for k in ("proposal_rate", "request_concentration") if k in entry],
    }
    return entry, described
