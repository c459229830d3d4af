"""What ``specsim check sampler`` prints: its help's description, and a verifier's verdict,
exact result and Monte Carlo tests in lines a person reads (``--json`` writes the report
itself)."""

from __future__ import annotations


def sampler_lines(r) -> str:
    """A chain window's check, as ``specsim check sampler`` prints it."""
    processing = f"temperature {r.temperature:g}, top-k {r.top_k or 'off'}, top-p {r.top_p:g}"
    window = f"k {r.k}" + (" (ragged 0..k)" if r.ragged else "")
    lines = [
        f"{r.verifier}: {r.description}",
        f"problem: vocab {r.vocab}, {window}, {r.drafter} drafter, {processing}, "
        f"problem seed {r.problem_seed}; inputs {r.inputs} in {r.dtype}; reference: "
        f"{r.reference}; judged: the whole window, tokens 1-{r.judged_tokens}",
        _verdict(r),
    ]
    if r.malformed is not None:
        lines.extend(_malformed_lines(r.malformed))
    if r.closed_form_max_abs_error is not None:
        lines.append(
            f"exact ({r.exact_method}: {r.exact_scope}): max |error| "
            f"{r.closed_form_max_abs_error:.3g}, TV {r.tv_distance:.3g} (exact needs <= "
            f"{r.exact_tolerance:.2g})"
        )
    else:
        lines.append(f"exact: {r.exact_note or 'not available for this verifier'}")
    lines.extend(_monte_carlo_lines(r))
    return "\n".join(lines)


def tree_lines(r) -> str:
    """A tree's check, as ``specsim check sampler --tree`` prints it."""
    drafter = "top-k children" if r.drafter == "greedy" else f"children drawn {r.drafts}"
    lines = [
        f"{r.verifier}: {r.description}",
        f"problem: vocab {r.vocab}, tree {r.tree_description} ({r.tree}), {drafter}, "
        f"temperature {r.temperature:g}, problem seed {r.problem_seed}; inputs {r.inputs} in "
        f"{r.dtype}; "
        f"reference: {r.reference}; judged: the whole window, tokens 1-{r.judged_tokens}",
        _verdict(r),
    ]
    if r.malformed is not None:
        lines.append(f"  reason: {r.malformed['reason']}")
        lines.extend(f"  {example}" for example in r.malformed["examples"])
    if r.closed_form_max_abs_error is None:
        lines.append(f"exact: {r.exact_note or 'not available for this verifier'}")
    else:
        size = "" if r.enumeration_cells is None else f"; {r.enumeration_cells:,} cells"
        lines.append(
            f"exact ({r.exact_method}: {r.exact_scope}{size}): max |error| "
            f"{r.closed_form_max_abs_error:.3g}, TV {r.tv_distance:.3g} (exact needs <= "
            f"{r.exact_tolerance:.2g})"
        )
    lines.extend(_monte_carlo_lines(r))
    return "\n".join(lines)


def _monte_carlo_lines(r) -> list[str]:
    if r.p_value is None:
        return [f"Monte Carlo: {r.monte_carlo_note}"]
    tests = len(r.window_tests)
    lines = [
        f"Monte Carlo: {r.samples:,} samples, seed {r.seed}: a Cressie-Read test of tokens 1-j "
        f"for each "
        f"j = 1..{tests}, each at level {r.alpha / tests:.3g} (alpha {r.alpha:g} / {tests}); "
        f"family p-value {r.p_value:.3g}"
    ]
    for test in r.window_tests:
        stat = "inf" if test["statistic"] is None else f"{test['statistic']:.1f}"
        impossible = (
            f", {test['impossible_samples']} samples outside the target's support"
            if test["impossible_samples"]
            else ""
        )
        lines.append(
            f"  tokens 1-{test['tokens']}: {test['cells']:,} cells, G = {stat}, dof "
            f"{test['dof']}, p {test['p_value']:.3g}{impossible}; detects TV >= "
            f"{test['detectable_tv']:.2g} on tokens 1-{test['tokens']} with {r.power:.0%} "
            "power"
        )
    return lines


def _verdict(r) -> str:
    if r.malformed is not None:
        return "verdict: NOT EXACT: the verifier's output breaks its contract"
    if r.lossless and r.lossy_by_design:
        return (
            f"verdict: LOSSLESS on this problem (output matches {r.reference}), but this "
            "verifier is lossy in general (e.g. at temperature > 0)"
        )
    if r.lossless and r.negative_control:
        return (
            f"verdict: LOSSLESS on this problem (output matches {r.reference}): here the control "
            "coincides with the exact verifier (e.g. one-hot p, or k = 1 for shared-uniform); "
            "the default problem shows the bug"
        )
    if r.lossless:
        return f"verdict: LOSSLESS (output matches {r.reference})"
    tv = "" if r.tv_distance is None else f", TV distance {r.tv_distance:.4g} from the target"
    why = " by design" if r.lossy_by_design else ""
    return f"verdict: LOSSY{why}{tv}"


def _malformed_lines(malformed: dict) -> list[str]:
    lines = [f"  reason: {malformed['reason']}"]
    for example in malformed["examples"]:
        got = ""
        if "tokens" in example:
            got = f" -> accepted {example['accepted']}, tokens {example['tokens']}"
        lines.append(
            f"  row {example['row']}: drafts {example['draft_tokens']} (n_drafts "
            f"{example['n_drafts']}), accept uniforms {example['accept_uniforms']}, sample "
            f"uniform {example['sample_uniform']}{got}"
        )
    return lines


SAMPLER_DESCRIPTION = """\
Check a verifier for losslessness on a seeded toy target p and drafter q that depend on the
prefix (order-2 context tables), processed by the shared temperature / top-k / top-p. The whole
window is judged: the first k + 1 emitted tokens, so every draft position and the bonus token.

1. Exact result (lossless needs max |error| <= 1e-12 in float64):
   - a built-in verifier or control: its closed form (numpy, float64), the exact joint of the
     first k + 1 tokens over every draft path and accept/reject outcome, chained over steps;
   - your own function: an exact enumeration of its step from the prompt over every draft path
     and every outcome of its uniforms (it is deterministic given them), continued by the
     target (tolerance: the rounding of its input dtype).
2. Monte Carlo (torch): the real batched verifier over --samples generations; a Cressie-Read
   (power-divergence, lambda 2/3) goodness-of-fit test of the first j tokens for each
   j = 1..k+1 (sparse cells pooled), each at level alpha / (k + 1), with the p-values, the
   seed and the smallest TV distance each detects with 99% power.

Your own verifier (--verifier package.module:function or path/to/file.py:function) is called as
  f(p, q, draft_tokens, n_drafts, randomness)
with p [B, k+1, V] and q [B, k, V] processed probabilities (q None for --drafter greedy),
draft_tokens [B, k] int64 (-1 past n_drafts [B]), and randomness.accept [B, k] and
randomness.sample [B], uniforms in [0, 1) it must use for all its random choices. With --inputs
logits it gets the raw target and drafter logits instead, plus keywords temperature, top_k and
top_p. It returns an object with .accepted [B] (drafts accepted) and .tokens [B, k+1] (the
accepted drafts, then the corrected or bonus token), or the pair (accepted, tokens). An output
that breaks this (an accepted prefix that differs from the drafts, a token outside [0, V), an
exception) is reported as a verdict with the offending rows.

--tree SHAPE checks tree verification instead (one tree step from the prompt, then the target,
over the tree's depth + 1 tokens): rejection is SpecInfer's multi-draft rule for children drawn
i.i.d. from q (--drafts iid) or Sequoia's for children drawn without replacement (--drafts
without-replacement); greedy follows the argmax child; typical is Medusa's. The exact result is
the closed form over every drafted token of every node (V^(depth+1) <= 65536 and
V^(max(width, depth) + 3) <= 2^24 cells, width the most children of a node), the Monte Carlo
test runs the real batched tree verifier; the tree-* controls must be flagged.

Your own tree verifier (--tree with --verifier MODULE:FUNCTION or path/to/file.py:function) is
called as
  f(p, q, draft_tokens, tree, randomness)
with tree a specsim.tree.TreeShape of N nodes in breadth-first order (tree.parents [N], -1 for
the root's children; tree.paths[i][-1] is node i's rank among its siblings; tree.depth D),
p [B, N+1, V] the target's processed probabilities (row 0 at the root, row i+1 after node i),
q [B, N+1, V] the drafter's, each row the distribution that node's children were drafted from
(None with --drafter greedy: top-k children), draft_tokens [B, N] int64, and
randomness.accept [B, N] (one uniform per node) and randomness.sample [B]. With --inputs logits
p and q are raw logits and the keyword temperature is added (top_k 0, top_p 1). It returns an
object with .accepted [B] (nodes accepted, 0..D), .path [B, D] (the accepted nodes from the
root down, -1 padded) and .tokens [B, D+1] (their tokens, then the corrected or bonus token).
The exact result enumerates every drafted tree (at most 4,096: e.g. --tree 2,1 --vocab 4, or
--drafter greedy) and every outcome of the uniforms. An adapter for a verifier that walks one
row at a time and takes p, q as [N+1, V] (15 lines):

  import torch

  def verify(p, q, draft_tokens, tree, randomness):
      rows, depth = draft_tokens.shape[0], tree.depth
      accepted = torch.zeros(rows, dtype=torch.long)
      path = torch.full((rows, depth), -1)
      tokens = torch.full((rows, depth + 1), -1)
      for b in range(rows):
          nodes, token = their_tree_verify(           # their code: a list of nodes, a token
              p[b], None if q is None else q[b], draft_tokens[b], tree.parents.tolist(),
              randomness.accept[b], float(randomness.sample[b]))
          accepted[b] = len(nodes)
          path[b, : len(nodes)] = torch.tensor(nodes, dtype=torch.long)
          tokens[b, : len(nodes)] = draft_tokens[b, nodes]
          tokens[b, len(nodes)] = token
      return type("Result", (), dict(accepted=accepted, path=path, tokens=tokens))

This judges one step. Bugs that show only across steps (uniforms reused from step to step, a
rejected draft's KV entry kept) pass it: `specsim check rollout --verifier ...` (or --step, with
your KV cache) judges whole runs.

Lossless means: distributed exactly as sampling from p (rejection); equal to target-only greedy
decoding (greedy). Typical acceptance is lossy by design. --control runs a known-wrong verifier,
which the check must flag. Exit 0 when a verdict is computed (lossless or not), 2 on bad input;
--fail-on-lossy makes an exact verifier found lossy exit 1.
"""
