"""Measuring acceptance on a prompt set: generate with the target, score every drafter, and
turn the scores into the profile's acceptance entries (and optional per-request sequences).

Which scores make each verifier's entry is the verifier registry's ``scoring``
(``specsim.sampling.kinds``). A greedy-reference verifier (greedy verification) is measured on
greedy (T = 0) text; the others (exact rejection sampling, typical acceptance) at each requested
temperature T > 0 on text sampled at T. Rejection at T = 0 equals greedy verification and is
written only when T = 0 is requested explicitly.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from specsim.errors import SpecsimError
from specsim.profiling.acceptance import (
    MAX_K,
    Scored,
    chain_statistics,
    format_sequences,
    request_concentration,
    run_lengths,
    run_lengths_from_matches,
)
from specsim.profiling.mtp_measure import mtp_scores
from specsim.profiling.specs import DrafterArg
from specsim.sampling.kinds import VERIFIER_KINDS

CHUNK = 16  # prompts generated together


@dataclass
class AcceptanceResult:
    entries: list[dict]
    tree_entries: list[dict] = field(default_factory=list)
    side_files: dict[str, str] = field(default_factory=dict)
    tokens_scored: int = 0
    notes: list[str] = field(default_factory=list)
    # prompt-lookup drafter -> [seconds spent proposing, positions proposed for]
    lookup_cost: dict[str, list[float]] = field(default_factory=dict)

    def lookup_seconds_per_step(self, drafter: str) -> float:
        seconds, positions = self.lookup_cost.get(drafter, (0.0, 0))
        return seconds / positions if positions else 0.0


def _verifier_runs(temperatures: Sequence[float]) -> list[tuple[float, list[str]]]:
    """(temperature, verifiers measured on text sampled at it)."""
    greedy = [k.name for k in VERIFIER_KINDS.values() if k.greedy_reference]
    sampled = [k.name for k in VERIFIER_KINDS.values() if not k.greedy_reference]
    at_zero = [name for name in sampled if VERIFIER_KINDS[name].scoring.at_zero]
    runs = {0.0: greedy}
    for t in sorted(set(temperatures)):
        runs[float(t)] = greedy + at_zero if t == 0 else sampled
    return sorted(runs.items())


# Per-position scores of a drafter along the text (``specsim.profiling.scoring``).
SCORES = ("beta", "text_accept", "match", "typical", "typical_tv")


def _entry(
    drafter: str, verifier: str, temperature: float, scored: list[Scored], firsts: list[np.ndarray]
) -> dict | None:
    stats = chain_statistics(scored, MAX_K)
    if stats is None:
        return None
    entry = {
        "drafter": drafter,
        "verifier": verifier,
        "temperature": temperature,
        "per_position": stats.per_position,
        "mean_acceptance_length": stats.mean_acceptance_length,
        "proposal_rate": max(stats.proposal_rate, 1e-6),
        "token_beta_mean": float(np.mean(np.concatenate(firsts))) if firsts else None,
        "source": "measured",
        "tokens_scored": stats.positions,
    }
    concentration = request_concentration(firsts)
    if concentration is not None:
        entry["request_concentration"] = concentration
    return {k: v for k, v in entry.items() if v is not None}


def measure_acceptance(
    target,
    draft_models: dict,
    drafters: Sequence[DrafterArg],
    prompt_ids: Sequence[list[int]],
    temperatures: Sequence[float],
    *,
    max_new_tokens: int,
    seed: int,
    eos_id: int | None,
    sequences_prefix: str | None = None,
    progress=None,
    tree_shapes: Sequence = (),
) -> AcceptanceResult:
    """Acceptance entries for every drafter x verifier x temperature (see module docstring),
    and tree entries for every draft model x ``tree_shapes`` (``TreeShape``) x tree verifier.

    ``draft_models`` maps drafter names to loaded models (prompt-lookup drafters need none).
    """
    result = AcceptanceResult(entries=[])
    for temperature, verifiers in _verifier_runs(temperatures):
        generations = _generate_all(
            target, prompt_ids, temperature, max_new_tokens, seed, eos_id, progress
        )
        result.tokens_scored += sum(len(g.tokens) for g in generations)
        for d in drafters:
            if d.is_ngram:
                rows = _score_prompt_lookup(d, generations, temperature, result)
            elif d.is_mtp:
                rows = mtp_scores(draft_models[d.name], generations, temperature)
            else:
                rows = _score_draft_model(draft_models[d.name], generations, temperature)
            for verifier in verifiers:
                _add_entry(result, d, verifier, temperature, rows, sequences_prefix)
            if tree_shapes and not (d.is_ngram or d.is_mtp):  # MTP drafts chains only
                result.tree_entries += _tree_entries(
                    d.name,
                    draft_models[d.name],
                    generations,
                    temperature,
                    verifiers,
                    tree_shapes,
                    seed,
                )
    return result


def _tree_entries(name, model, generations, temperature, verifiers, shapes, seed) -> list[dict]:
    from specsim.profiling.scoring import drafter_logits
    from specsim.profiling.tree_measure import tree_entries

    q_logits = []
    for start in range(0, len(generations), CHUNK):
        q_logits += drafter_logits(model, generations[start : start + CHUNK])
    return tree_entries(name, q_logits, generations, temperature, verifiers, shapes, seed)


def _generate_all(target, prompt_ids, temperature, max_new_tokens, seed, eos_id, progress):
    """The target's continuations of every prompt (one seeded generator per temperature)."""
    import torch

    from specsim.profiling.scoring import generate_target_text

    generator = torch.Generator().manual_seed(seed)
    generations = []
    for start in range(0, len(prompt_ids), CHUNK):
        chunk = list(prompt_ids[start : start + CHUNK])
        generations += generate_target_text(
            target, chunk, temperature, max_new_tokens, generator, eos_id
        )
        if progress is not None:
            progress.update(len(chunk))
    generations = [g for g in generations if len(g.tokens) >= 2]
    if not generations:
        raise SpecsimError(
            "the target generated fewer than 2 tokens for every prompt",
            file="--prompts",
            fix="use longer prompts or a larger --max-new-tokens",
        )
    return generations


def _score_draft_model(model, generations, temperature) -> dict[str, list]:
    """Per-request arrays per position: beta and the acceptance given the text (exact), greedy
    match, typical pass probability and its distance from p."""
    from specsim.profiling.scoring import draft_model_scores, drafter_logits

    rows: dict[str, list] = {key: [] for key in SCORES}
    for start in range(0, len(generations), CHUNK):
        chunk = generations[start : start + CHUNK]
        for g, q in zip(chunk, drafter_logits(model, chunk), strict=True):
            for key, value in draft_model_scores(g.logits, q, temperature, g.tokens).items():
                rows[key].append(value)
    return rows


def _score_prompt_lookup(d: DrafterArg, generations, temperature, result) -> dict[str, list]:
    """Per-request acceptance matrices of the lookup's proposals, and their lengths; also
    times the lookup itself (its cost per step goes into the profile)."""
    from specsim.drafters import proposals
    from specsim.profiling.scoring import ngram_scores

    rows: dict[str, list] = {key: [] for key in (*SCORES, "drafts")}
    cost = result.lookup_cost.setdefault(d.name, [0.0, 0])
    for g in generations:
        t0 = time.perf_counter()
        tokens, lengths = proposals(g.prompt, g.tokens, d.ngram, MAX_K)
        cost[0] += time.perf_counter() - t0
        cost[1] += len(g.tokens)
        for key, value in ngram_scores(g.logits, tokens, lengths, temperature, g.tokens).items():
            rows[key].append(value)
        rows["drafts"].append(lengths)
    return rows


def _add_entry(result, d: DrafterArg, verifier, temperature, rows, sequences_prefix) -> None:
    scoring = VERIFIER_KINDS[verifier].scoring
    key = scoring.score
    walked = rows[scoring.walk]
    if d.scored_by_start:
        scored = [Scored(a, dr) for a, dr in zip(walked, rows["drafts"], strict=True)]
        firsts = [a[dr > 0, 0] for a, dr in zip(rows[key], rows["drafts"], strict=True)]
        firsts = [f for f in firsts if len(f)]
    else:
        scored = [Scored.from_beta(b) for b in walked]
        firsts = list(rows[key])
    entry = _entry(d.name, verifier, temperature, scored, firsts)
    if entry is not None and scoring.tv is not None:
        tv = np.concatenate(rows[scoring.tv])
        entry["tv_distance"] = float(np.nanmean(tv)) if np.isfinite(tv).any() else 0.0
    if entry is None:
        result.notes.append(
            f"{d.name} never proposed a draft at T={temperature:g}: no {verifier} entry written."
        )
        return
    if sequences_prefix is not None:
        _add_sequences(result, entry, d, rows, key, sequences_prefix)
    result.entries.append(entry)


def _add_sequences(result, entry, d: DrafterArg, rows, key: str, prefix: str) -> None:
    """Per-request sequences, of the verifier's ``scoring.sequences`` kind: run lengths (greedy),
    or the walked acceptance of a draft model (exact rejection's beta)."""
    scoring = VERIFIER_KINDS[entry["verifier"]].scoring
    kind = scoring.sequences
    if kind == "run_length":
        if d.scored_by_start:
            values = [run_lengths(a, dr) for a, dr in zip(rows[key], rows["drafts"], strict=True)]
        else:
            values = [run_lengths_from_matches(m) for m in rows[key]]
    elif kind == "beta" and not d.scored_by_start:
        values = rows[scoring.walk]  # replayed as the walk chains them
    else:
        return
    name = f"{prefix}.{d.name}.{entry['verifier']}.T{entry['temperature']:g}.txt"
    result.side_files[name] = format_sequences(values, kind)
    entry["sequences"] = {"path": name, "kind": kind, "requests": len(values)}
