"""The losslessness check over whole runs: bugs that only show across steps.

A verifier can be exact at every single step and still be wrong over a sequence: it may reuse
its accept uniforms from step to step, or its step may keep a rejected draft's KV entry, or
read the bonus token from a stale position. ``check_sequences`` runs many generations of n
tokens from the prompt of the checker's toy order-2 target/drafter pair (``problem.ToyModels``)
with the verifier -- or a whole step function that owns its KV cache (``sequence_loops``) -- in
the loop, and compares the distribution of the n-token sequences with the target's, which is
known exactly (``reference.target_distribution``: a product of the target's table rows).

The comparison is the checkers' Monte Carlo test (``stats.window_tests``): a Cressie-Read test
of the first j tokens for each j = 1..n at level alpha / n, with the sample size, the seed and
the smallest TV distance each test detects with the stated power. The exact part is the target
side: an enumeration of a run would range over every step's uniforms, so the run itself is
sampled. The planted controls (``SEQUENCE_CONTROLS``) must be flagged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from specsim.errors import SpecsimError
from specsim.sampling import plugin, reference, stats
from specsim.sampling.checker import MAX_VOCAB, MAX_WINDOW_CELLS
from specsim.sampling.problem import Processing, ToyModels
from specsim.tree import TreeShape

DEFAULT_TOKENS = 6


@dataclass(frozen=True)
class SequenceControl:
    name: str
    description: str
    kind: str  # "verifier" (in specsim's loop) or "step" (owns the cache)
    tree: str | None  # the shape it is checked on (None: the chain of --k)


SEQUENCE_CONTROLS: dict[str, SequenceControl] = {
    c.name: c
    for c in (
        SequenceControl("exact-step", "the exact chain step with its cache (must pass)", "step",
                        None),
        SequenceControl("reused-uniforms", "the exact verifier handed its first step's "
                        "uniforms at every later step", "verifier", None),
        SequenceControl("kept-rejected-entry", "the rollback keeps the rejected draft's KV "
                        "entry", "step", None),
        SequenceControl("stale-bonus-position", "the bonus token read from the target row one "
                        "position early", "step", None),
        SequenceControl("unnormalised-residual", "after a sibling's rejection the next "
                        "sibling is tested against max(0, p' - q') unnormalised", "verifier",
                        "2,1"),
    )
}  # fmt: skip


@dataclass(frozen=True)
class SequenceCheck:
    subject: str
    description: str
    kind: str  # "verifier" or "step"
    lossless: bool
    negative_control: bool
    tree: list[list[int]]
    tree_description: str
    drafts: str
    tokens: int  # n: the sequence length judged
    vocab: int
    temperature: float
    problem_seed: int
    samples: int
    seed: int
    alpha: float
    power: float
    reference: str
    malformed: dict[str, Any] | None
    p_value: float | None
    statistic: float | None
    dof: int | None
    impossible_samples: int | None
    detectable_tv: float | None
    window_tests: list[dict[str, Any]] | None
    monte_carlo_note: str | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def check_sequences(
    verifier: str | Callable | None = None,
    *,
    step: str | Callable | None = None,
    control: str | None = None,
    tree: str | None = None,
    k: int = 3,
    drafts: str = "iid",
    tokens: int = DEFAULT_TOKENS,
    vocab: int = 4,
    samples: int = 200_000,
    seed: int = 0,
    temperature: float = 1.0,
    problem_seed: int = 0,
    alpha: float = 0.01,
    power: float = 0.99,
) -> SequenceCheck:
    """Judge whole runs of ``verifier`` (a built-in name, ``module:function`` or a callable
    with the tree verifier signature, ``tree_verifiers``; on the chain of ``k`` drafts unless
    ``tree`` is given), of a ``step`` function (``sequence_loops`` documents it; chains), or
    of a planted ``control``. Lossless only if every prefix test passes at level alpha / n."""
    name, description, kind, function, negative, tree = _subject(
        verifier, step, control, tree, drafts
    )
    shape = TreeShape.chain(k) if tree is None else _parse(tree)
    _validate(shape, kind, k, drafts, tokens, vocab, samples, temperature, alpha, power)
    processing = Processing(float(temperature))
    models = ToyModels.make(vocab, problem_seed)
    target = reference.target_distribution(models.tables(processing).p, models.prompt, tokens)
    result = _run(kind, function, models, processing, shape, drafts, tokens, samples, seed)
    if isinstance(result, np.ndarray):
        mc = stats.window_result(result, target, alpha, power)
    else:
        keys = ("p_value", "statistic", "dof", "impossible_samples", "detectable_tv")
        note = "stopped: the output broke the contract"
        mc = {**dict.fromkeys(keys), "window_tests": None, "monte_carlo_note": note,
              "malformed": result.to_json()}  # fmt: skip
    lossless = mc["malformed"] is None and mc["p_value"] >= alpha
    return SequenceCheck(
        subject=name, description=description, kind=kind, lossless=lossless,
        negative_control=negative, tree=shape.to_paths(), tree_description=shape.describe(),
        drafts=drafts, tokens=tokens, vocab=vocab, temperature=processing.temperature,
        problem_seed=problem_seed, samples=samples, seed=seed, alpha=alpha, power=power,
        reference="target sampling, n tokens from the prompt (exact product of p rows)", **mc,
    )  # fmt: skip


def _subject(verifier, step, control, tree, drafts):
    """(name, description, kind, function factory, negative control, tree)."""
    from specsim.sampling import sequence_loops as loops

    given = [x is not None for x in (verifier, step, control)]
    if sum(given) > 1:
        raise SpecsimError(
            "give one of --verifier, --step and --control", key="--step", fix="drop the others"
        )
    if step is not None:
        function = plugin.load_verifier(step) if isinstance(step, str) else step
        return _name(step), "user-supplied step function", "step", lambda: function, False, tree
    if control is not None:
        c = SEQUENCE_CONTROLS.get(control)
        if c is None:
            fix = f"use {', '.join(SEQUENCE_CONTROLS)}"
            raise SpecsimError(f"unknown control {control!r}", key="--control", fix=fix)
        factories = {
            "exact-step": loops.make_step,
            "reused-uniforms": lambda: loops.uniforms_reused(_builtin("rejection", drafts)),
            "kept-rejected-entry": lambda: loops.make_step(kept_rejected_entry=True),
            "stale-bonus-position": lambda: loops.make_step(stale_bonus=True),
            "unnormalised-residual": _unnormalised_residual,
        }
        negative = control != "exact-step"
        return c.name, c.description, c.kind, factories[control], negative, tree or c.tree
    verifier = verifier or "rejection"
    if callable(verifier) or plugin.is_plugin_spec(verifier):
        function = plugin.load_verifier(verifier) if isinstance(verifier, str) else verifier
        what = "user-supplied tree verifier"
        return _name(verifier), what, "verifier", lambda: function, False, tree
    from specsim.sampling.kinds import VERIFIER_KINDS

    if verifier not in VERIFIER_KINDS:
        names = ", ".join(VERIFIER_KINDS)
        raise SpecsimError(
            f"unknown verifier {verifier!r}",
            key="--verifier",
            fix=f"use {names} or MODULE:FUNCTION",
        )
    description = VERIFIER_KINDS[verifier].description
    return verifier, description, "verifier", lambda: _builtin(verifier, drafts), False, tree


def _builtin(name: str, drafts: str) -> Callable:
    from specsim.sampling.kinds import tree_verifier_for

    return tree_verifier_for(name, drafts).load()


def _unnormalised_residual() -> Callable:
    from specsim.sampling.tree_inputs import prepare_tree
    from specsim.sampling.tree_walks import ExactRule, rejection_walk

    def verify(p, q, draft_tokens, tree, randomness):
        step = prepare_tree(p, q, draft_tokens, tree, randomness, False, True, None)
        return rejection_walk(step, randomness, ExactRule("iid", normalise_residual=False))

    return verify


def _name(function) -> str:
    return function if isinstance(function, str) else getattr(function, "__name__", "function")


def _run(kind, factory, models, processing, shape, drafts, n, samples, seed):
    """Counts [V]*n over ``samples`` runs, or the first contract breach."""
    import torch

    from specsim.sampling import sequence_loops as loops
    from specsim.sampling.tree_montecarlo import tree_tables

    tables = tree_tables(models, processing, "float64")
    generator = torch.Generator().manual_seed(seed)
    counts = np.zeros((models.vocab,) * n, dtype=np.int64)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: intra-op threads only add contention
    try:
        for start in range(0, samples, loops.CHUNK_ROWS):
            rows = min(loops.CHUNK_ROWS, samples - start)
            if kind == "step":
                out = loops.run_step_loop(factory(), tables, shape.depth, n, rows, generator)
            else:
                out = loops.run_verifier_loop(
                    factory(), tables, shape, drafts, False, n, rows, generator
                )
            if not isinstance(out, torch.Tensor):
                return out
            counts += loops.to_numpy_counts(out, models.vocab)
    finally:
        torch.set_num_threads(threads)
    return counts


def _parse(tree: str) -> TreeShape:
    try:
        return TreeShape.parse(str(tree))
    except SpecsimError as exc:
        raise SpecsimError(exc.message, key="--tree", fix=exc.fix) from None


def _validate(shape, kind, k, drafts, tokens, vocab, samples, temperature, alpha, power):
    checks = [
        (2 <= vocab <= MAX_VOCAB, "--vocab", f"use 2..{MAX_VOCAB}"),
        (1 <= k <= 8, "--k", "use 1..8"),
        (tokens >= 1 and vocab**tokens <= MAX_WINDOW_CELLS, "--tokens",
         f"use 1..{int(np.log(MAX_WINDOW_CELLS) / np.log(vocab))} at --vocab {vocab} (vocab^n "
         f"sequences, at most {MAX_WINDOW_CELLS:,})"),
        (samples >= 1, "--samples", "use a positive count"),
        (0 < temperature < float("inf"), "--temperature", "use a temperature > 0"),
        (0 < alpha < 1, "--alpha", "use a level in (0, 1), e.g. 0.01"),
        (0 < power < 1, "power", "use a value in (0, 1), e.g. 0.99"),
        (drafts in ("iid", "without-replacement"), "--drafts", "use iid or without-replacement"),
        (kind == "verifier" or shape.is_chain, "--tree",
         "a step function runs a chain: give --k instead of --tree"),
    ]  # fmt: skip
    for ok, key, fix in checks:
        if not ok:
            raise SpecsimError("value out of range", key=key, fix=fix)
    if max(len(shape.children(node)) for node in range(-1, shape.num_nodes)) > vocab:
        raise SpecsimError(
            "a node has more children than the vocabulary has tokens", key="--tree",
            fix="use a narrower tree or a larger --vocab",
        )  # fmt: skip


def describe(r: SequenceCheck) -> str:
    """A short human summary."""
    if r.malformed is not None:
        verdict = f"verdict: NOT EXACT: the output breaks the contract: {r.malformed['reason']}"
    elif r.lossless:
        verdict = "verdict: LOSSLESS over whole runs (no departure from the target detected)"
    else:
        verdict = "verdict: LOSSY over whole runs"
    if r.negative_control:
        verdict += " (a planted bug: it must be flagged)"
    lines = [
        f"{r.subject}: {r.description}",
        f"problem: vocab {r.vocab}, {r.tree_description}, children drawn {r.drafts}, "
        f"temperature {r.temperature:g}, problem seed {r.problem_seed}; runs of {r.tokens} "
        f"tokens from the prompt; reference: {r.reference}",
        verdict,
    ]
    if r.window_tests is None:
        return "\n".join(lines)
    tests = len(r.window_tests)
    lines.append(
        f"Monte Carlo: {r.samples:,} runs, seed {r.seed}: a Cressie-Read test of tokens 1-j for "
        f"each j = 1..{tests}, each at level {r.alpha / tests:.3g}; family p-value "
        f"{r.p_value:.3g}"
    )
    for test in r.window_tests:
        stat = "inf" if test["statistic"] is None else f"{test['statistic']:.1f}"
        lines.append(
            f"  tokens 1-{test['tokens']}: {test['cells']:,} cells, G = {stat}, p "
            f"{test['p_value']:.3g}; detects TV >= {test['detectable_tv']:.2g} with "
            f"{r.power:.0%} power"
        )
    return "\n".join(lines)
