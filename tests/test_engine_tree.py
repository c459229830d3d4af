"""The serving engine's tree steps: continuous batching of tree steps, lossless end to end.

Greedy: every request served through ``ServingEngine`` (rows joining and leaving the batch, the
last row moved into a finished row's slot) gets the target's own greedy tokens; a divergence
counts as a numerical near-tie only when the target's top-two logit margin there is below
``NEAR_TIE`` (as for the offline loop). The cache audit (each live row's caches hold exactly its
sequence, their logits a fresh pass's) runs after every decode iteration and finds nothing.

Sampling (exact rejection): N = 2000 requests of one fixed prompt, four output tokens each,
served 64 at a time, each from its own random stream (seed, request id); their four tokens are
compared with the exact distribution under the target alone (top-k 2 sampling: 16 cells, by
cache-free passes), as ``tests/test_e2e_tree.py`` does for the offline loop. A Cressie-Read test
at alpha = 0.01 (seed 11) detects a departure of total variation >= ``detectable_tv``
(reported; about 0.075) with 99 % power.

Planted faults: the accepted path's keys and values not moved into place (``TreeFaults``), and
the target's rollback keeping one node too many (``Faults``); both must change greedy output,
fail the audit and be rejected by the distribution test.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_e2e_lossless import NEAR_TIE, exact_joint, greedy_divergences, greedy_reference
from test_engine import check_records, scenario_file, serve
from test_engine_common import model, prompt_bank

from specsim.engine.engine import EngineOptions, ServingEngine
from specsim.engine.generate import audit_caches
from specsim.engine.run import BENCH_FILE, write_run
from specsim.engine.step import Faults, Sampling
from specsim.engine.tree_step import TreeFaults
from specsim.engine.workload import EngineRequest
from specsim.errors import SpecsimError
from specsim.sampling.stats import detectable_tv, goodness_of_fit
from specsim.tree import TreeShape

GREEDY = Sampling(temperature=0.0, verifier="greedy")
SHAPE = TreeShape.parse("2,2,1")
FAULTS = {
    "path-not-kept": {"tree_faults": TreeFaults(skip_path_compaction=True)},
    "target-off-by-one": {"faults": Faults(target_rollback_extra=1)},
}


class AuditedEngine(ServingEngine):
    """The serving engine, auditing every live row's caches after each decode iteration."""

    problems: list[str]

    def _decode_iteration(self, start: float) -> float:
        now = super()._decode_iteration(start)
        self.problems += audit_caches(self.target, self.drafter, self.batch.rows())
        return now


class OnePrompt:
    """Every request gets the same prompt (a prompt bank's interface)."""

    def __init__(self, ids: list[int]):
        self.ids = ids

    def prompt(self, index: int, length: int) -> list[int]:
        return self.ids[:length]


def serve_requests(
    requests, sampling, shape=SHAPE, drafts="top-k", prompts=None, max_batch=3, audit=True, **faults
):
    options = EngineOptions(
        max_batch=max_batch,
        sampling=sampling,
        window=lambda rows: shape.depth,
        k_max=shape.depth,
        seed=11,
        tree=shape,
        tree_drafts=drafts,
        **faults,
    )
    drafter = model("specsim-draft-tiny" if prompts is not None else "specsim-draft-small")
    kind = AuditedEngine if audit else ServingEngine
    engine = kind(model("specsim-target"), drafter, prompts or prompt_bank(), options)
    engine.problems = []
    return engine.run(requests), engine


def greedy_requests() -> list[EngineRequest]:
    # Arriving together but owed different lengths: rows finish at different steps, later
    # requests take their slots (the last row moved in), and rows owed fewer tokens than a
    # path gives cap what they keep.
    return [EngineRequest(i, 0.0, 10 + 3 * i, 5 + (7 * i) % 13) for i in range(8)]


def greedy_check(**faults):
    done, engine = serve_requests(greedy_requests(), GREEDY, **faults)
    target = model("specsim-target")
    divergences = []
    for request in done:
        reference, margins = greedy_reference(target, [request.prompt_ids], request.output_len)
        served = torch.tensor([request.output_ids])
        divergences += [
            (request.rid, i, m) for _, i, m in greedy_divergences(served, reference, margins)
        ]
    return done, engine, divergences


def test_served_greedy_tree_steps_equal_the_targets_greedy_output():
    done, engine, divergences = greedy_check()
    for rid, position, margin in divergences:
        print(f"near-tie flip: request {rid} position {position} logit margin {margin:.2e}")
    assert all(margin < NEAR_TIE for _, _, margin in divergences), divergences
    assert engine.problems == []
    assert [len(r.output_ids) for r in done] == [r.output_len for r in done]
    assert sum(r.accepted for r in done) > 0
    assert max(engine.log.batch) == 3 and engine.log.kind.count("prefill") > 1


@pytest.mark.parametrize("fault", FAULTS)
def test_planted_tree_rollback_faults_break_served_greedy_output_and_the_audit(fault):
    _, engine, divergences = greedy_check(**FAULTS[fault])
    assert any(margin >= NEAR_TIE for _, _, margin in divergences)
    assert any("target cache" in problem for problem in engine.problems)


ALPHA = 0.01
REQUESTS = 2000
SAMPLED = Sampling(temperature=1.0, top_k=2, verifier="rejection")
# A rank-1 leaf: a step that accepts it keeps a path off the breadth-first order (the path
# fault's case); prompt 1, where the token after it depends on the cache (tests/test_e2e_tree).
SAMPLED_SHAPE = TreeShape.parse("[[0], [1], [0, 0]]")
TOKENS = 4
MAX_BATCH = 64


def served_fit_test(drafts: str, **faults):
    target = model("specsim-target")
    prompt = prompt_bank().prompt(1, 12)
    joint = exact_joint(target, prompt, SAMPLED, TOKENS)
    cells = sorted(joint)
    index = {c: i for i, c in enumerate(cells)}
    expected = np.array([joint[c] for c in cells])
    requests = [EngineRequest(i, 0.0, len(prompt), TOKENS) for i in range(REQUESTS)]
    done, _ = serve_requests(
        requests, SAMPLED, SAMPLED_SHAPE, drafts, OnePrompt(prompt), MAX_BATCH, False, **faults
    )
    counts = np.zeros(len(cells) + 1)  # the last cell: outcomes the target cannot produce
    for request in done:
        counts[index.get(tuple(request.output_ids), len(cells))] += 1
    result = goodness_of_fit(counts, np.append(expected, 0.0))
    return result, detectable_tv(expected, REQUESTS, ALPHA), done


# Sampled (i.i.d.) children: each node's draft uniform comes from its request's stream as well.
# The offline tests cover every drafting; this one covers the serving path.
@pytest.mark.slow
def test_served_sampled_tree_steps_match_the_target_distribution():
    result, tv, done = served_fit_test("iid")
    print(f"p = {result.p_value:.3g}, cells {result.cells}, detectable TV {tv:.3f}")
    accepted = sum(r.accepted for r in done)
    assert 0 < accepted < sum(r.drafted for r in done)
    assert tv < 0.1
    assert result.p_value > ALPHA


@pytest.mark.slow
@pytest.mark.parametrize("fault", FAULTS)
def test_planted_tree_rollback_faults_are_rejected_when_serving(fault):
    result, _, _ = served_fit_test("iid", **FAULTS[fault])
    assert result.p_value < ALPHA


TREE = {"drafter": "small", "tree": "2,2,1", "tree_drafts": "iid", "verifier": "rejection"}


def test_a_tree_scenario_runs_through_run_engine_with_the_chains_fields(tmp_path):
    scenario = scenario_file(tmp_path, speculation=TREE)
    run = serve(scenario)
    records, log = run.records, run.log
    check_records(records, scenario)  # drafts and accepted counted as a chain of depth 3's
    # Each request gets the length its workload asked for (EOS ignored), as without speculation.
    plain = serve(scenario_file(tmp_path, speculation={"drafter": None, "k": 0})).records
    assert np.array_equal(records["output_tokens"], plain["output_tokens"])
    assert records["accepted"].sum() > 0
    tree = run.summary["scenario"]["tree"]
    assert (tree["nodes"], tree["depth"], tree["nodes_per_depth"]) == (10, 3, [2, 4, 4])
    assert tree["drafts"] == "iid"
    assert tree["nodes_verified"] == 10 * log.decode_rows == 10 * records["steps"].sum()
    assert 1.0 < run.summary["mean_acceptance_length"] <= 4.0
    # Every decode row verifies the root and all 10 nodes; each attends to its ancestors and
    # itself (1 + 2 x 2 + 4 x 3 + 4 x 4 = 33 pairs a row) beside the padded context.
    for i, kind in enumerate(log.kind):
        if kind == "decode":
            assert log.window[i] == 3
            assert log.new_tokens[i] == 11 * log.batch[i]
            assert log.pairs[i] == 11 * log.context[i] + 33 * log.batch[i]
    drafted = np.concatenate(log.drafted)
    assert drafted.max() == 3 and drafted.min() >= 0
    # The benchmark-results writer states the run as vLLM counts a window of the tree's depth.
    write_run(run, tmp_path / "run")
    bench = json.loads((tmp_path / "run" / BENCH_FILE).read_text())
    assert bench["spec_decode_accepted_tokens"] == records["accepted"].sum()
    assert bench["spec_decode_num_drafts"] == int((drafted > 0).sum())  # steps that drafted
    assert len(bench["spec_decode_per_position_acceptance_rates"]) == 3


def test_a_requests_tree_tokens_do_not_depend_on_its_batch(tmp_path):
    alone = scenario_file(
        tmp_path,
        workload__concurrency=1,
        engine={"max_batch": 1, "chunked_prefill": False},
        speculation=TREE,
    )
    shared = scenario_file(tmp_path, speculation=TREE)
    first, second = serve(alone).records, serve(shared).records
    for name in ("steps", "drafted", "accepted", "output_tokens"):
        assert np.array_equal(first[name], second[name]), name


def test_a_tree_drafted_by_prompt_lookup_is_a_one_line_error(tmp_path):
    scenario = scenario_file(tmp_path, speculation={**TREE, "drafter": "ngram"})
    with pytest.raises(SpecsimError, match="drafts trees with a draft model"):
        serve(scenario)
