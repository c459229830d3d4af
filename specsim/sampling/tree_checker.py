"""The losslessness checker for tree verification: an exact result plus a Monte Carlo test.

``check_tree_sampler`` judges a tree verifier (``kinds.TREE_VERIFIER_KINDS``), a tree control
(``tree_controls.TREE_CONTROLS``) or your own tree verifier (a callable or ``module:function``
with the ``tree_verifiers`` signature) on the checker's seeded toy target/drafter pair
(``problem.ToyModels``) for one tree shape, over the whole window of D + 1 tokens (D the tree's
depth): one tree step from the prompt, continued by the target alone.

1. **Exact result**: for a built-in rule, the closed form (``tree_reference``, numpy float64) of
   the step's output over every drafted token of every node and every accept/reject outcome,
   continued by the target; exact means within 1e-12 of what the target alone produces. Sizes:
   V^(D+1) <= 65,536 window cells and V^(max(W, D) + 3) <= 2^24 cells for a tree of depth D
   whose widest node has W children (``tree_reference.MAX_CELLS``). For your own function, the
   enumeration of its step over every drafted tree and every outcome of its uniforms
   (``tree_enumeration``; at most 4,096 trees), exact within the rounding of its input dtype.
2. **Monte Carlo** (torch): the real batched verifier over many rows (``tree_montecarlo``), a
   Cressie-Read test of the first j tokens for each j = 1..D+1 at level alpha / (D + 1), with the
   sample size, the seed and the smallest TV distance each test detects with the stated power
   (``stats.window_tests``).

The drafter draws each node's children from q i.i.d. or without replacement (``drafts``), or
takes q's top-k tokens (``drafter="greedy"``: a deterministic drafter, q None for the verifier).
The tree problem runs at a temperature > 0 with no top-k/top-p, so that q has full support and
every node can have as many distinct children as the vocabulary allows.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from specsim.bounds import MIN_FACTOR, MIN_LEVEL
from specsim.errors import SpecsimError
from specsim.sampling import checker, plugin, reference, tree_reference
from specsim.sampling.checker import MAX_VOCAB, MAX_WINDOW_CELLS
from specsim.sampling.kinds import (
    TREE_DRAFTS,
    TREE_VERIFIER_KINDS,
    VERIFIER_KINDS,
    tree_verifier_for,
)
from specsim.sampling.problem import DRAFTERS, Processing, ToyModels
from specsim.sampling.tree_controls import TREE_CONTROLS
from specsim.tree import TreeShape

DEFAULT_TREE = "2,2,1"


@dataclass(frozen=True)
class TreeSamplerCheck:
    """The verdict, the evidence (exact result, then Monte Carlo) and the set-up."""

    verifier: str
    description: str
    lossless: bool
    lossy_by_design: bool
    negative_control: bool
    reference: str  # "target sampling" or "target greedy decoding"
    tree: list[list[int]]  # the shape's paths
    tree_description: str
    drafts: str  # how a sampling drafter drew each node's children
    judged_tokens: int  # D + 1
    exact_method: str | None  # "closed form", "enumeration", or None (not available)
    exact_scope: str | None
    exact_tolerance: float
    closed_form_max_abs_error: float | None  # None: no exact result (exact_note says why)
    tv_distance: float | None
    exact_note: str | None
    enumeration_cells: int | None  # the closed form's largest array
    enumeration_cases: int | None  # drafted trees enumerated for a callable
    malformed: dict[str, Any] | None
    p_value: float | None  # None: Monte Carlo skipped
    statistic: float | None
    dof: int | None
    impossible_samples: int | None
    detectable_tv: float | None
    window_tests: list[dict[str, Any]] | None
    power: float
    alpha: float
    samples: int
    seed: int
    problem_seed: int
    vocab: int
    temperature: float
    drafter: str
    inputs: str  # "probs" or "logits": what the verifier was given
    dtype: str
    monte_carlo_note: str | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TreeSubject:
    name: str
    description: str
    rule: tree_reference.TreeRule | None  # None: a callable, enumerated
    drafts: str
    greedy_reference: bool
    lossy_by_design: bool
    negative_control: bool
    load: Any  # () -> the torch verifier
    drafters: tuple[str, ...] = DRAFTERS  # the drafters it can be checked with


def tree_subject(
    verifier: str | Callable,
    drafts: str | None,
    greedy_reference: bool = False,
    lossy_by_design: bool = False,
) -> TreeSubject:
    """A built-in verifier (with the drafts it is checked under), a tree verifier's own name
    (``rejection-without-replacement``), a tree control, or your own tree verifier (a callable
    or its ``module:function`` name)."""
    if callable(verifier) or plugin.is_plugin_spec(verifier):
        function = plugin.load_verifier(verifier) if isinstance(verifier, str) else verifier
        name = verifier if isinstance(verifier, str) else getattr(function, "__name__", "verifier")
        what = "user-supplied tree verifier" + (" (lossy by design)" if lossy_by_design else "")
        return TreeSubject(
            name, what, None, _drafts(drafts), greedy_reference, lossy_by_design, False,
            lambda: function,
        )  # fmt: skip
    if verifier in TREE_CONTROLS:
        control = TREE_CONTROLS[verifier]
        if drafts not in (None, control.drafts):
            raise SpecsimError(
                f"the control {verifier} drafts its children {control.drafts}",
                key="--drafts",
                fix="drop --drafts",
            )
        return TreeSubject(
            control.name, f"negative control: {control.description}", control.rule,
            control.drafts, False, False, True, lambda: control.verifier, control.drafters,
        )  # fmt: skip
    named = TREE_VERIFIER_KINDS.get(verifier)
    if named is not None and named.drafts is not None:  # a tree entry's own name
        if drafts not in (None, named.drafts):
            raise SpecsimError(
                f"{verifier} is checked with {named.drafts} drafts", key="--drafts",
                fix=f"drop --drafts, or give --verifier {named.verifier}",
            )  # fmt: skip
        verifier, drafts = named.verifier, named.drafts
    if verifier not in VERIFIER_KINDS:
        names = ", ".join([*VERIFIER_KINDS, *TREE_VERIFIER_KINDS, *TREE_CONTROLS])
        raise SpecsimError(
            f"unknown tree verifier {verifier!r}", key="--verifier", fix=f"use {names}"
        )
    drafts = _drafts(drafts)
    kind = tree_verifier_for(verifier, drafts)
    return TreeSubject(
        kind.name, kind.description, kind.closed_form(), drafts, kind.kind.greedy_reference,
        kind.kind.lossy, False, kind.load,
    )  # fmt: skip


def _drafts(drafts: str | None) -> str:
    drafts = drafts or TREE_DRAFTS[0]
    if drafts not in TREE_DRAFTS:
        fix = f"use {', '.join(TREE_DRAFTS)}"
        raise SpecsimError("value out of range", key="--drafts", fix=fix)
    return drafts


def check_tree_sampler(
    verifier: str | Callable = "rejection",
    *,
    tree: TreeShape | str = DEFAULT_TREE,
    drafts: str | None = None,
    vocab: int = 8,
    samples: int = 200_000,
    seed: int = 0,
    temperature: float = 1.0,
    drafter: str = "sample",
    alpha: float = 0.01,
    power: float = 0.99,
    problem_seed: int = 0,
    dtype: str = "float32",
    greedy_reference: bool = False,
    lossy_by_design: bool = False,
    inputs: str = "probs",
) -> TreeSamplerCheck:
    """Check a tree verifier (a ``VERIFIER_KINDS`` name, checked as ``tree_verifier_for`` its
    drafts, default i.i.d.), a tree control, or your own tree verifier (a callable or
    ``module:function``, with the ``tree_verifiers`` signature; ``inputs="logits"`` hands it raw
    logits and the keywords temperature, top_k and top_p) on ``tree`` (a shape or
    ``TreeShape.parse`` text). ``samples=0`` skips the Monte Carlo test. Lossless only if the
    exact result (a closed form, or the enumeration of a callable) is within its tolerance and
    every window Cressie-Read test passes at level alpha / (D + 1)."""
    shape = parse_tree(tree)
    subject = tree_subject(verifier, drafts, greedy_reference, lossy_by_design)
    _validate(shape, subject, vocab, samples, temperature, drafter, alpha, power, dtype)
    checker.check_seeds(seed, problem_seed)
    if inputs not in ("probs", "logits") or (inputs == "logits" and subject.rule is not None):
        raise SpecsimError(
            "built-in tree verifiers and controls take processed probabilities",
            key="--inputs",
            fix="use --inputs logits only with a MODULE:FUNCTION verifier",
        )
    processing = Processing(float(temperature))
    models = ToyModels.make(vocab, problem_seed)
    setup = _TreeSetup(subject, models, processing, shape, drafter == "greedy", inputs, dtype)
    window = shape.depth + 1
    target = reference.target_distribution(
        setup.p_table, models.prompt, window, greedy=subject.greedy_reference
    )
    exact = _exact(setup, target, seed)
    mc = _monte_carlo(setup, samples, seed, target, alpha, power, exact.pop("malformed"))
    malformed = mc.pop("malformed")
    return TreeSamplerCheck(
        verifier=subject.name,
        description=subject.description,
        lossless=all(checker.exact_verdicts(exact, mc, malformed, alpha)),
        lossy_by_design=subject.lossy_by_design,
        negative_control=subject.negative_control,
        reference="target greedy decoding" if subject.greedy_reference else "target sampling",
        tree=shape.to_paths(),
        tree_description=shape.describe(),
        drafts="top-k" if setup.deterministic else subject.drafts,
        judged_tokens=window,
        malformed=None if malformed is None else malformed.to_json(),
        power=power,
        alpha=alpha,
        samples=samples if mc["p_value"] is not None else 0,
        seed=seed,
        problem_seed=problem_seed,
        vocab=vocab,
        temperature=processing.temperature,
        drafter=drafter,
        inputs=inputs,
        dtype=dtype,
        **exact,
        **mc,
    )


@dataclass(frozen=True)
class _TreeSetup:
    subject: TreeSubject
    models: ToyModels
    processing: Processing
    shape: TreeShape
    deterministic: bool
    inputs: str
    dtype: str

    @property
    def p_table(self) -> np.ndarray:
        return self.models.tables(self.processing).p

    def tables(self):
        from specsim.sampling.tree_montecarlo import tree_tables

        return tree_tables(
            self.models, self.processing, self.dtype, self.subject.greedy_reference,
            self.inputs == "logits",
        )  # fmt: skip

    def verifier(self) -> Callable:
        """The verifier as the walks call it: with the processing keywords for raw logits."""
        function = self.subject.load()
        if self.inputs == "probs":
            return function
        keywords = dict(temperature=self.processing.temperature, top_k=0, top_p=1.0)
        return functools.partial(function, **keywords)


def _exact(setup: _TreeSetup, target: np.ndarray, seed: int) -> dict[str, Any]:
    """The closed form of a built-in rule, or the enumeration of a callable."""
    shape, window = setup.shape, setup.shape.depth + 1
    result = checker.exact_fields(enumeration_cells=None)
    subject, models = setup.subject, setup.models
    if subject.rule is not None:
        step = tree_reference.tree_step(
            models.tables(setup.processing), shape, subject.rule, subject.drafts, models.prompt,
            setup.deterministic,
        )  # fmt: skip
        produced = reference.first_step_window(
            step, setup.p_table, models.prompt, subject.greedy_reference
        )
        result.update(
            exact_method="closed form",
            exact_scope=f"one tree step from the prompt over every drafted token and outcome, "
            f"then the target; tokens 1-{window}",
            enumeration_cells=tree_reference.enumeration_cells(shape, models.vocab),
        )
    elif not checker.torch_available():
        result["exact_note"] = checker.NO_TORCH
        return result
    else:
        from specsim.sampling.tree_enumeration import enumerate_tree_step

        enumerated = enumerate_tree_step(
            setup.verifier(), setup.tables(), shape, subject.drafts, setup.deterministic,
            p_table=setup.p_table, greedy_reference=subject.greedy_reference, seed=seed,
        )  # fmt: skip
        scope = f"one tree step from the prompt over its {enumerated.cases:,} drafted trees"
        tolerance = checker.callable_tolerance(setup.dtype, models.vocab, shape.num_nodes)
        checker.record_enumeration(result, enumerated, scope, window, tolerance)
        if enumerated.window is None:
            return result
        produced = enumerated.window
    return checker.record_window(result, produced, target)


def parse_tree(tree: TreeShape | str) -> TreeShape:
    """A TreeShape from ``TreeShape.parse`` text; its errors name ``--tree``."""
    if isinstance(tree, TreeShape):
        return tree
    try:
        return TreeShape.parse(str(tree))
    except SpecsimError as exc:
        raise SpecsimError(exc.message, key="--tree", fix=exc.fix) from None


def _monte_carlo(setup: _TreeSetup, samples, seed, target, alpha, power, malformed) -> dict:
    def run():
        from specsim.sampling.tree_montecarlo import run_tree_monte_carlo

        return run_tree_monte_carlo(
            setup.verifier(), setup.tables(), setup.shape, setup.subject.drafts, samples, seed,
            deterministic=setup.deterministic,
        )  # fmt: skip

    return checker.monte_carlo_result(samples, malformed, run, target, alpha, power)


def _validate(shape, subject, vocab, samples, temperature, drafter, alpha, power, dtype) -> None:
    checks = [
        (2 <= vocab <= MAX_VOCAB, "--vocab", f"use 2..{MAX_VOCAB}"),
        (samples >= 0, "--samples", "use 0 (exact result only) or a positive count"),
        (MIN_FACTOR <= temperature < float("inf"), "--temperature",
         f"use a temperature from {MIN_FACTOR:g} with --tree (the tree problem needs q of full "
         "support)"),
        (drafter in DRAFTERS, "--drafter", f"use one of {', '.join(DRAFTERS)}"),
        (MIN_LEVEL <= alpha < 1, "--alpha", f"use a level in [{MIN_LEVEL:g}, 1), e.g. 0.01"),
        (0 < power < 1, "power", "use a value in (0, 1), e.g. 0.99"),
        (dtype in ("float32", "float64"), "--dtype", "use float32 or float64"),
        (drafter in subject.drafters, "--drafter",
         f"this tree control needs --drafter {' or '.join(subject.drafters)}"),
    ]  # fmt: skip
    for ok, key, fix in checks:
        if not ok:
            raise SpecsimError("value out of range", key=key, fix=fix)
    width = max(len(shape.children(node)) for node in range(-1, shape.num_nodes))
    if width > vocab:
        raise SpecsimError(
            f"a node with {width} children needs more than --vocab {vocab} tokens",
            key="--tree",
            fix=f"use at most {vocab} children per node, or a larger --vocab",
        )
    window = vocab ** (shape.depth + 1)
    cells = tree_reference.enumeration_cells(shape, vocab)
    if window > MAX_WINDOW_CELLS or cells > tree_reference.MAX_CELLS:
        raise SpecsimError(
            f"{shape.describe()} at vocab {vocab} needs {window:,} window cells (at most "
            f"{MAX_WINDOW_CELLS:,}) and {cells:,} closed-form cells (at most "
            f"{tree_reference.MAX_CELLS:,}) for its exact result",
            key="--tree",
            fix="use a shallower or narrower tree, or a smaller --vocab",
        )
