"""A scenario's ``speculation`` section: drafter, window size k or tree, verifier, window policy
and their per-pool changes (``specsim.scenario`` holds the whole file)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from specsim.bounds import (
    BatchSize,
    Probability,
    Temperature,
    WindowSize,
)
from specsim.choices import WINDOW_POLICIES, schema_description, schema_literal
from specsim.config import Name, StrictModel
from specsim.errors import SpecsimError
from specsim.policy_settings import AcceptanceGate, AcceptanceShift, AdaptiveSteps
from specsim.profile.acceptance import TREE_DRAFTS
from specsim.sampling.kinds import DEFAULT_VERIFIER, VerifierName, verifier_descriptions
from specsim.tree import TreeShape


class KByBatch(StrictModel):
    """A row of the 'by_batch' policy: use ``k`` while the batch is at most ``max_batch``."""

    max_batch: BatchSize = Field(description="largest running batch this row applies to")
    k: WindowSize = Field(description="window size for such batches")


WindowPolicyName = schema_literal(WINDOW_POLICIES)
TreeDraftsName = Literal[tuple(TREE_DRAFTS)]  # type: ignore[valid-type]
TreeText = str | list[list[int]]


def parse_tree(tree: TreeText) -> TreeShape:
    """A scenario's ``speculation.tree``: widths per depth (``2,2,1``) or a list of paths."""
    if isinstance(tree, list):
        return TreeShape.from_paths(tree)
    return TreeShape.parse(tree)


def _tree_error(exc: SpecsimError) -> ValueError:
    return ValueError(f"speculation.tree: {exc.message}" + (f"; fix: {exc.fix}" if exc.fix else ""))


class Speculation(StrictModel):
    """Speculative decoding settings: which drafter, how many tokens per step, which verifier."""

    drafter: Name | None = Field(
        default=None,
        description="a drafter named in the profile's `drafters`; none = speculation off",
    )
    k: WindowSize = Field(
        default=4, description="window size: tokens drafted per step (0 = speculation off)"
    )
    verifier: VerifierName = Field(default=DEFAULT_VERIFIER, description=verifier_descriptions())
    temperature: Temperature = Field(
        default=1.0, description="sampling temperature; picks the profile's acceptance entry"
    )
    policy: WindowPolicyName = Field(
        default="fixed", description=schema_description(WINDOW_POLICIES)
    )
    k_by_batch: list[KByBatch] = Field(
        default_factory=list,
        description="'by_batch' table, rows sorted by max_batch; batches above the last row "
        "use k = 0",
    )
    acceptance: Literal["per_position", "iid", "sequences"] = Field(
        default="per_position",
        description="acceptance model: 'per_position' conditional rates from the profile; "
        "'iid': one rate for every position (`acceptance_rate`, default the profile's first "
        "position); 'sequences': replay the profile's per-request sequences",
    )
    acceptance_rate: Probability | None = Field(
        default=None, description="'iid': the per-draft acceptance rate (default: profile's)"
    )
    heterogeneity: bool = Field(
        default=True,
        description="draw a per-request acceptance level from the profile's "
        "request_concentration (when it has one)",
    )
    tree: TreeText | None = Field(
        default=None,
        description="draft a tree per step instead of a chain: widths per depth (`2,2,1`: two "
        "children per node at depths 1 and 2, one at depth 3; 10 nodes) or a list of paths of "
        "child ranks (`[[0], [1], [0, 0]]`, as vLLM's speculative_token_tree). k is the tree's "
        "depth (set from it; a k that differs is refused). Each step's accepted length is drawn "
        "from the profile's tree_acceptance table for this shape (derived from its rates when "
        "the shape was not measured; no per-request heterogeneity); policy 'fixed' and "
        "acceptance 'per_position' only; draft models and decoding heads only",
    )
    tree_drafts: TreeDraftsName = Field(
        default="top-k",
        description="how the tree's children are drafted (picks the profile's tree_acceptance "
        "entry): " + "; ".join(f"'{k}': {v}" for k, v in TREE_DRAFTS.items()),
    )
    max_concurrency: BatchSize | None = Field(
        default=None,
        description="policy 'fixed': speculation off (k = 0) while more sequences than this "
        "run (TensorRT-LLM's max_concurrency; a k_by_batch table ends its own rows instead); "
        "absent: no cut-off",
    )
    acceptance_gate: AcceptanceGate | None = Field(
        default=None,
        description="TensorRT-LLM's acceptance off-switch, with policy 'fixed' or 'by_batch'; "
        "absent: speculation stays on whatever the acceptance",
    )
    adaptive_steps: AdaptiveSteps | None = Field(
        default=None,
        description="policy 'adaptive_steps': SGLang's adaptive config (absent: its defaults)",
    )
    acceptance_shift: AcceptanceShift | None = Field(
        default=None,
        description="a change of acceptance part-way through the workload (rate models only); "
        "absent: every request accepts as the profile says",
    )

    @model_validator(mode="before")
    @classmethod
    def _k_from_tree(cls, data):
        # k is the tree's depth: taken from the tree unless given (a given k is checked below).
        if isinstance(data, dict) and data.get("tree") is not None and "k" not in data:
            tree = data["tree"]
            try:
                shape = parse_tree(str(tree) if isinstance(tree, int) else tree)
            except SpecsimError as exc:
                raise _tree_error(exc) from None
            except (TypeError, ValueError):
                return data  # the field's own type check says what is wrong
            data = {**data, "k": shape.depth}
        if isinstance(data, dict) and isinstance(data.get("tree"), int):
            data = {**data, "tree": str(data["tree"])}
        return data

    @property
    def tree_shape(self) -> TreeShape | None:
        return None if self.tree is None else parse_tree(self.tree)

    def _check_tree(self) -> None:
        if self.tree is None:
            # An explicit tree: null turns a tree off (the baseline run) and leaves its drafts.
            if "tree_drafts" in self.model_fields_set and "tree" not in self.model_fields_set:
                raise ValueError("tree_drafts applies only with a tree (speculation.tree)")
            return
        try:
            shape = parse_tree(self.tree)
        except SpecsimError as exc:
            raise _tree_error(exc) from None
        if self.k != shape.depth:
            raise ValueError(
                f"k is {self.k} but the tree {self.tree!r} has depth {shape.depth}: with a "
                f"tree, k is its depth; fix: remove k or set it to {shape.depth}"
            )
        if self.policy != "fixed" or self.k_by_batch:
            raise ValueError(
                f"a tree runs with policy 'fixed' only (got {self.policy!r}"
                + (" and a k_by_batch table" if self.k_by_batch else "")
                + "); fix: remove speculation.tree or use policy: fixed"
            )
        if self.acceptance != "per_position":
            raise ValueError(
                f"a tree's accepted lengths come from the profile's tree_acceptance table, not "
                f"acceptance {self.acceptance!r}; fix: remove acceptance (per_position)"
            )

    @model_validator(mode="after")
    def _complete(self) -> Speculation:
        self._check_tree()
        if self.policy == "by_batch":
            if not self.k_by_batch:
                raise ValueError("policy 'by_batch' needs a 'k_by_batch' table")
            sizes = [row.max_batch for row in self.k_by_batch]
            if sizes != sorted(set(sizes)):
                raise ValueError("k_by_batch rows must have increasing max_batch")
        if self.acceptance_rate is not None and self.acceptance != "iid":
            raise ValueError("acceptance_rate applies only with acceptance: iid")
        self._check_switches()
        return self

    def _check_switches(self) -> None:
        """The engine switches go with the policies whose engines have them."""
        policy = self.policy
        if self.max_concurrency is not None and policy != "fixed":
            raise ValueError(
                f"max_concurrency cuts a fixed k off (policy 'fixed'), not policy {policy!r}"
                + ("; fix: end the k_by_batch table there" if policy == "by_batch" else "")
            )
        if self.acceptance_gate is not None and policy not in ("fixed", "by_batch"):
            raise ValueError(
                f"acceptance_gate is TensorRT-LLM's, for policy 'fixed' or 'by_batch', not "
                f"{policy!r}; fix: remove acceptance_gate or change the policy"
            )
        if self.adaptive_steps is not None and policy != "adaptive_steps":
            raise ValueError("adaptive_steps applies only with policy: adaptive_steps")
        if policy == "adaptive_steps":
            steps = self.steps_config.candidate_steps
            if self.k not in steps:
                raise ValueError(
                    f"k (the initial steps) is {self.k}, not one of the candidate steps "
                    f"{steps}; fix: set k to one of them (SGLang refuses it too)"
                )
        if policy == "adaptive_verification" and self.acceptance == "sequences":
            raise ValueError(
                "adaptive_verification ranks drafts by the rate models' expected survival, "
                "which replayed sequences do not give; fix: use acceptance per_position or iid"
            )
        if self.acceptance_shift is not None and self.acceptance == "sequences":
            raise ValueError(
                "acceptance_shift scales the rate models' rates, not replayed sequences; fix: "
                "use acceptance per_position or iid"
            )
        if self.acceptance_shift is not None and self.tree is not None:
            raise ValueError("acceptance_shift applies to chains, not speculation.tree")

    @property
    def steps_config(self) -> AdaptiveSteps:
        """Policy 'adaptive_steps': the scenario's config, else SGLang's defaults."""
        return self.adaptive_steps if self.adaptive_steps is not None else AdaptiveSteps()

    @property
    def enabled(self) -> bool:
        if self.drafter is None:
            return False
        return self.max_k > 0

    @property
    def max_k(self) -> int:
        """The widest window the policy may choose (0: speculation off)."""
        if self.drafter is None:
            return 0
        if self.policy == "by_batch":
            return max(row.k for row in self.k_by_batch)
        if self.policy == "adaptive_steps":
            return max(self.steps_config.candidate_steps)
        return self.k


class SpeculationOverride(StrictModel):
    """A pool's changes to the scenario's speculation settings (unset fields are inherited)."""

    drafter: Name | None = Field(default=None, description="see speculation.drafter")
    k: WindowSize | None = Field(default=None, description="see speculation.k")
    verifier: VerifierName | None = Field(default=None, description="see speculation.verifier")
    temperature: Temperature | None = Field(default=None, description="see speculation.temperature")
    policy: WindowPolicyName | None = Field(default=None, description="see speculation.policy")
    k_by_batch: list[KByBatch] | None = Field(
        default=None, description="see speculation.k_by_batch"
    )
    acceptance: Literal["per_position", "iid", "sequences"] | None = Field(
        default=None, description="see speculation.acceptance"
    )
    acceptance_rate: Probability | None = Field(
        default=None, description="see speculation.acceptance_rate"
    )
    heterogeneity: bool | None = Field(default=None, description="see speculation.heterogeneity")
    tree: TreeText | None = Field(
        default=None, description="see speculation.tree; null turns the scenario's tree off"
    )
    tree_drafts: TreeDraftsName | None = Field(
        default=None, description="see speculation.tree_drafts"
    )
    max_concurrency: BatchSize | None = Field(
        default=None, description="see speculation.max_concurrency"
    )
    acceptance_gate: AcceptanceGate | None = Field(
        default=None, description="see speculation.acceptance_gate"
    )
    adaptive_steps: AdaptiveSteps | None = Field(
        default=None, description="see speculation.adaptive_steps"
    )
    acceptance_shift: AcceptanceShift | None = Field(
        default=None, description="see speculation.acceptance_shift"
    )
