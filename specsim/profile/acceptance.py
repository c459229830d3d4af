"""A profile's acceptance statistics: per drafter x verifier x temperature (``Acceptance``), per
request from a side file (``AcceptanceSequences``), and per speculation-tree shape
(``TreeAcceptance``, with the stated model that derives an unmeasured shape)."""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
from pydantic import Field, model_validator

from specsim.bounds import (
    MAX_COUNT,
    MAX_K,
    Count,
    Factor,
    Probability,
    Requests,
    Seed,
    Share,
    Temperature,
)
from specsim.config import Name, StrictModel
from specsim.errors import SpecsimError
from specsim.profile.reported import (
    AcceptanceHistogram,
    histogram_concentration,
    histogram_rates,
    table_rates,
)
from specsim.sampling.kinds import VERIFIER_KINDS, VerifierName, verifier_descriptions
from specsim.tree import MAX_TREE_NODES, TreeShape


class AcceptanceSequences(StrictModel):
    """Per-request acceptance for trace-driven simulation, in a text file beside the profile.

    One request per line, whitespace-separated values, one per generated position:
    ``run_length``: how many tokens a step starting there would emit with unlimited k (a window
    of k emits min(value, k + 1)); ``beta``: the probability that a draft at that position is
    accepted (the profiler writes, for exact rejection, the probability given the token the text
    emits there: min(1, q / p) at it; see ``specsim.profiling.scoring``).
    """

    path: str = Field(description="relative to the profile file")
    kind: Literal["run_length", "beta"]
    requests: Requests


class Acceptance(StrictModel):
    """Acceptance of one drafter under one verifier at one temperature.

    ``per_position[i]`` is the conditional probability that draft i + 1 of a step is accepted
    given drafts 1..i were (the chain statistic, walked over real steps). For drafters that do not
    always propose (n-gram lookup), the rates are conditional on a proposal and
    ``proposal_rate`` is the share of steps that propose at all.

    ``per_position`` is walked with the widest window, whose steps start elsewhere than a
    narrower window's; where ``mean_acceptance_length`` holds every k from 1 up, the simulator
    chains the rates that reproduce each of those lengths instead
    (``specsim.simulation.acceptance.window_rates``).

    Acceptance as engines report it may stand in for ``per_position``: a mean acceptance length
    at one k or a table of them (``mean_acceptance_length``), or counts of steps by accepted
    drafts (``acceptance_histograms``). Where ``per_position`` is absent it is derived from them
    by the rules in ``specsim.profile.reported``; where given, it is kept.
    """

    drafter: Name
    verifier: VerifierName = Field(description=verifier_descriptions())
    temperature: Temperature
    per_position: list[Probability] = Field(
        default_factory=list,
        max_length=MAX_K,
        description="conditional rate of draft i + 1 given drafts 1..i were accepted. Absent: "
        "from the widest acceptance_histograms entry (u_i = share of steps that accepted at "
        "least i drafts, rate i = u_i / u_(i-1)), else from mean_acceptance_length (positions "
        "1..k0 of the smallest k given share the constant rate a with 1 + a + ... + a^k0 = "
        "L_k0, solved to rounding; each further k's rate is its gain L_k - L_(k-1) over the "
        "chain's reach, within [0, 1], so where the table falls the rates are 0 from there on; "
        "lengths of a drafter with proposal_rate r < 1 are first taken per proposal, "
        "1 + (L - 1) / r)",
    )
    mean_acceptance_length: dict[
        Annotated[int, Field(ge=1, le=MAX_K)], Annotated[float, Field(ge=1, le=MAX_K + 1)]
    ] = Field(
        default_factory=dict,
        description="k -> 1 + accepted / steps, as measured or published (at most k + 1): one "
        "k (a scalar length) or an AL(k) table, which need not rise with k; without gaps "
        "(every k from the smallest given to the largest), or the profile is refused. Absent "
        "with acceptance_histograms: their mean lengths, 1 + r x the mean accepted drafts at "
        "proposal_rate r (the histograms count the steps that proposed)",
    )
    acceptance_histograms: list[AcceptanceHistogram] = Field(
        default_factory=list,
        max_length=MAX_K,
        description="steps counted by accepted drafts, one histogram per k (vLLM's per-request "
        "metrics.speculative_decoding, SGLang's meta_info): where absent, mean_acceptance_length "
        "is each one's at its k, and per_position and (from per-request counts) "
        "request_concentration are the widest k's",
    )
    proposal_rate: Share = 1.0
    request_concentration: Factor | None = Field(
        default=None,
        description="heterogeneity across requests: each request's rate scale is drawn from a "
        "Beta with this concentration (larger = more alike); absent = all alike. Absent with "
        "per-request acceptance_histograms counts: fitted to the spread of the requests' "
        "first-draft acceptance by the method of moments (beta-binomial; none where the "
        "spread is within what the step counts alone give)",
    )
    token_beta_mean: Probability | None = Field(
        default=None, description="beta averaged over every position (overstates chains)"
    )
    tv_distance: Probability | None = Field(
        default=None, description="lossy verifiers: distance of their output from p"
    )
    sequences: AcceptanceSequences | None = None
    source: Literal["measured", "calibrated", "published", "assumed"] = "measured"
    tokens_scored: Count | None = None

    @model_validator(mode="after")
    def _lengths_from_histograms(self) -> Acceptance:
        # Before the length checks, so that a derived table is checked as a given one is.
        ks = [h.k for h in self.acceptance_histograms]
        if len(set(ks)) < len(ks):
            raise ValueError(
                f"acceptance_histograms for {self.drafter}/{self.verifier} has two at one k; "
                "fix: give one histogram per k (sum the runs)"
            )
        if not self.mean_acceptance_length:
            # The histograms count steps that proposed; the length is over every step.
            self.mean_acceptance_length = {
                h.k: 1.0 + self.proposal_rate * (h.mean_length() - 1.0)
                for h in self.acceptance_histograms
            }
        return self

    @model_validator(mode="after")
    def _lengths_within_windows(self) -> Acceptance:
        for k, length in self.mean_acceptance_length.items():
            if length > k + 1:
                raise ValueError(
                    f"mean_acceptance_length at k = {k} is {length:g}, more than the k + 1 = "
                    f"{k + 1} tokens a step emits; fix: give 1 + accepted / steps"
                )
        return self

    @model_validator(mode="after")
    def _lengths_without_a_gap(self) -> Acceptance:
        # The simulator chains the lengths from k = 1 up to the first missing k; past a gap a
        # length would be silently ignored (and the chain contradict it), so refuse one.
        ks = sorted(self.mean_acceptance_length)
        missing = sorted(set(range(ks[0], ks[-1] + 1)) - set(ks)) if ks else []
        if missing:
            given = ", ".join(map(str, ks))
            lacks = ", ".join(map(str, missing))
            raise ValueError(
                f"mean_acceptance_length for {self.drafter}/{self.verifier} has k = {given} but "
                f"not k = {lacks}: the simulator chains every k from 1 up and would ignore the "
                f"lengths past the gap; fix: add k = {lacks} (measure it), or remove the k "
                "values past the gap"
            )
        return self

    @model_validator(mode="after")
    def _derived_from_reported_forms(self) -> Acceptance:
        # Converted once at load time, so the simulator reads per_position as always.
        if self.acceptance_histograms:
            widest = max(self.acceptance_histograms, key=lambda h: h.k)
            if self.request_concentration is None and widest.requests:
                self.request_concentration = histogram_concentration(widest.requests)
            if not self.per_position:
                self.per_position = histogram_rates(widest.pooled())
        if self.per_position:
            return self
        if not self.mean_acceptance_length:
            raise ValueError(
                f"acceptance for {self.drafter}/{self.verifier} has no per_position, "
                "mean_acceptance_length or acceptance_histograms; fix: give one of them"
            )
        for k, length in self.mean_acceptance_length.items():
            if 1.0 + (length - 1.0) / self.proposal_rate > k + 1:
                raise ValueError(
                    f"mean_acceptance_length at k = {k} is {length:g}, more than k + 1 "
                    f"tokens per proposal at proposal_rate {self.proposal_rate:g}; fix: give "
                    "1 + accepted / steps over every step, or the share of steps that propose"
                )
        self.per_position = table_rates(self.mean_acceptance_length, self.proposal_rate)
        return self


TREE_DRAFTS = {
    "top-k": "rank r is the drafter's r-th most likely token (EAGLE-2's expansion)",
    "iid": "children drawn independently from q (SpecInfer)",
    "without-replacement": "children drawn from q without replacement (Sequoia, RSD)",
}
# Rounding to 6 significant digits leaves a distribution's sum this close to 1, and more.
TREE_SUM_TOLERANCE = 1e-4


class TreeMonteCarlo(StrictModel):
    """How a tree entry's estimated scores were drawn (``profiling.tree_without_replacement``)."""

    seed: Seed = Field(description="the estimate's generator seed")
    samples: Annotated[int, Field(ge=1, le=MAX_COUNT)] = Field(
        description="sibling histories drawn per scored position"
    )
    standard_error: Annotated[float, Field(ge=0, le=MAX_K)] = Field(
        description="of mean_acceptance_length: the spread of the replicates' walks / sqrt(count)"
    )


class TreeAcceptance(StrictModel):
    """Acceptance of one drafter's trees of one shape under one verifier at one temperature.

    ``accepted_length[j]`` is the probability that a step accepts j drafted nodes (j = 0 .. the
    tree's depth; the step emits j + 1 tokens), walked over the target's own text as the chain
    rates are (``specsim.profiling.tree_acceptance``). ``rates[d][r]`` is the conditional
    probability that the rank-r child of a node at depth d is accepted, given the step reached
    that node and rejected its elder siblings (null where no step tried it): what a shape that was
    not measured is derived from (``derive_tree_acceptance``, entries with source 'derived').
    """

    drafter: Name
    verifier: VerifierName = Field(description=verifier_descriptions())
    temperature: Temperature
    tree: list[list[Annotated[int, Field(ge=0, le=MAX_TREE_NODES)]]] = Field(
        min_length=1,
        description="the drafted nodes as paths of child ranks from the root, breadth-first "
        "(specsim.tree: [[0], [1], [0, 0]] is two children and one grandchild)",
    )
    drafts: Literal[tuple(TREE_DRAFTS)] = Field(  # type: ignore[valid-type]
        description="how each node's children were drafted: "
        + "; ".join(f"{k}: {v}" for k, v in TREE_DRAFTS.items())
    )
    accepted_length: list[Probability] = Field(
        min_length=2, description="P(a step accepts j nodes), j = 0 .. depth; sums to 1"
    )
    mean_acceptance_length: Annotated[float, Field(ge=1, le=MAX_K + 1)] = Field(
        description="1 + the mean accepted nodes per step"
    )
    rates: list[list[Probability | None]] = Field(
        default_factory=list,
        description="[depth][rank]: conditional acceptance of the rank-r child of a node at "
        "depth d (0: the root's children), null where no step tried it",
    )
    source: Literal["measured", "derived"] = Field(
        default="measured",
        description="measured: walked for this shape; derived: this shape was not measured and "
        "its distribution comes from another's rates (see derived_from)",
    )
    derived_from: str | None = Field(
        default=None, description="derived entries: the measurement the rates come from"
    )
    tokens_scored: Count | None = None
    monte_carlo: TreeMonteCarlo | None = Field(
        default=None,
        description="present where part of the scores was estimated (without-replacement "
        "children past the third of a node): the seed, histories and standard error",
    )

    @property
    def shape(self) -> TreeShape:
        return TreeShape(tuple(tuple(path) for path in self.tree))

    @model_validator(mode="after")
    def _consistent(self) -> TreeAcceptance:
        try:
            shape = self.shape
        except SpecsimError as exc:
            raise ValueError(exc.message + (f"; fix: {exc.fix}" if exc.fix else "")) from None
        if len(self.accepted_length) != shape.depth + 1:
            raise ValueError(
                f"accepted_length has {len(self.accepted_length)} entries for a tree of depth "
                f"{shape.depth}; fix: give one per accepted count 0..{shape.depth}"
            )
        total = sum(self.accepted_length)
        if abs(total - 1.0) > TREE_SUM_TOLERANCE:
            raise ValueError(f"accepted_length sums to {total:.6g}; fix: give probabilities")
        mean = 1.0 + sum(j * p for j, p in enumerate(self.accepted_length))
        if abs(mean - self.mean_acceptance_length) > 1e-3:
            raise ValueError(
                f"mean_acceptance_length {self.mean_acceptance_length:g} but accepted_length "
                f"gives {mean:.6g}; fix: give 1 + the mean of accepted_length"
            )
        return self


def derive_tree_acceptance(rates: list[list[float | None]], shape: TreeShape) -> list[float]:
    """The stated model for a shape that was not measured: each child is accepted, given the
    step reached its parent and rejected its elder siblings, at ``rates[d][r]`` of its depth and
    rank, independently of the rest. Depths past the rates take the deepest given depth's; a
    rank without a rate accepts nothing (an unmeasured sibling is not assumed to help).
    Returns P(j nodes accepted), j = 0 .. depth."""
    if not rates:
        raise ValueError("no rates to derive a tree from")
    dist = np.zeros(shape.depth + 1)
    mass = {-1: 1.0}
    for node in (-1, *range(shape.num_nodes)):
        depth = 0 if node < 0 else int(shape.depths[node])
        here = mass.pop(node)
        row = rates[min(depth, len(rates) - 1)]
        for rank, child in enumerate(shape.children(node)):
            rate = row[rank] if rank < len(row) and row[rank] is not None else 0.0
            mass[child] = here * rate
            here -= mass[child]
        dist[depth] += here
    return [float(p) for p in dist]


def _same_pair(entry, drafter: str, verifier: str, temperature: float) -> bool:
    """Whether an acceptance entry is of this drafter and verifier, at a temperature within
    0.05 unless the verifier is greedy."""
    free = VERIFIER_KINDS[verifier].greedy_reference
    close = free or abs(entry.temperature - temperature) <= 0.05
    return entry.drafter == drafter and entry.verifier == verifier and close


def tree_base_rates(
    profile, drafter: str, verifier: str, temperature: float, drafts: str
) -> tuple[list[list[float | None]], str, bool]:
    """The ``rates[depth][rank]`` an unmeasured tree of this drafter, verifier, temperature and
    drafting is derived from, where they come from, and whether that is a measured tree: the
    largest measured tree's, else the chain entry's per-position rates as the best (rank-0)
    child's, siblings accepting nothing."""
    measured = [
        t
        for t in profile.tree_acceptance or []
        if _same_pair(t, drafter, verifier, temperature)
        and t.drafts == drafts
        and t.source == "measured"
        and t.rates
    ]
    if measured:
        base = max(measured, key=lambda t: (t.shape.num_nodes, -abs(t.temperature - temperature)))
        return base.rates, f"the measured tree {base.tree} ({base.drafts} drafts)", True
    chains = [a for a in profile.acceptance if _same_pair(a, drafter, verifier, temperature)]
    if not chains:
        raise SpecsimError(
            f"no acceptance of drafter {drafter!r} under {verifier!r} at temperature "
            f"{temperature:g} to derive a tree from",
            key="tree_acceptance",
            fix="profile the pair (a tree shape or its chain) with this verifier",
        )
    chain = min(chains, key=lambda a: abs(a.temperature - temperature))
    rates = [[rate] for rate in chain.per_position]
    return rates, "the chain's per_position rates (rank 0 only)", False


def tree_entry(
    profile, drafter: str, verifier: str, temperature: float, shape: TreeShape, drafts: str
) -> TreeAcceptance:
    """The measured entry for this tree, else one derived (``derive_tree_acceptance``) from
    ``tree_base_rates``."""
    for entry in profile.tree_acceptance or []:
        same = _same_pair(entry, drafter, verifier, temperature) and entry.drafts == drafts
        if same and entry.shape == shape and entry.source == "measured":
            return entry
    rates, origin, _ = tree_base_rates(profile, drafter, verifier, temperature, drafts)
    dist = derive_tree_acceptance(rates, shape)
    return TreeAcceptance(
        drafter=drafter,
        verifier=verifier,
        temperature=temperature,
        tree=shape.to_paths(),
        drafts=drafts,
        accepted_length=dist,
        mean_acceptance_length=1.0 + float(np.dot(np.arange(len(dist)), dist)),
        source="derived",
        derived_from=origin,
    )
