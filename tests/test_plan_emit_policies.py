"""``--emit`` after a policy comparison: one rule for the three commands. The best policy an
engine runs (the goodput policy left out) is written where it is not the static k and beats
speculation off: an engine's own policy, or a k-by-batch table (vLLM's by-batch windows).
Hand-made outcomes; the files are rendered as the commands render them.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from test_plan_support import write_scenario

from specsim.planning.capacity import capacity
from specsim.planning.emit import emit, emit_choice
from specsim.planning.report import Report
from specsim.planning.window import window

TABLE = [{"max_batch": 8, "k": 3}, {"max_batch": 96, "k": 1}]


def _files(choice) -> dict:
    planned = SimpleNamespace(summary={}, report=Report("t"))
    emit.attach(planned, choice, emit.emit_request("vllm,sglang,trtllm", None))
    return planned


# -- plan capacity --------------------------------------------------------------------------------


def _capacity(tmp_path, repo, replicas: dict[str, int], off: int):
    """A plan with ``--policies by_batch,adaptive_steps`` and hand-made results: $2 a
    replica, capacity 12 / replicas req/s; the plan itself chose the static k = 2."""
    scenario = write_scenario(tmp_path, repo, requests=100, slo={"ttft_s": 1.0, "tpot_s": 0.05})
    plan = capacity.prepare(str(scenario), [], 12.0, None, [1, 2], 0.2, 0.99, None)
    plan.policies = ("by_batch", "adaptive_steps")

    def result(label, drafter, k, policy, n):
        candidate = capacity.Candidate(label, drafter, k, policy)
        return SimpleNamespace(
            candidate=candidate, replicas=n, capacity=12.0 / n, cost_per_hour=2.0 * n
        )

    own = [
        result("speculation off", None, 0, "fixed", off),
        result("llama3.2-1b k=1", "llama3.2-1b", 1, "fixed", replicas["static"] + 1),
        result("llama3.2-1b k=2", "llama3.2-1b", 2, "fixed", replicas["static"]),
        result("llama3.2-1b adaptive", "llama3.2-1b", 2, "adaptive", replicas["adaptive"]),
    ]
    table = result("llama3.2-1b k-by-batch", "llama3.2-1b", 3, "by_batch", replicas["by_batch"])
    steps = result(
        "llama3.2-1b adaptive_steps", "llama3.2-1b", 2, "adaptive_steps", replicas["steps"]
    )
    outcome = {"chosen": own[2], "candidates": own, "fleet": [(replicas["static"], None)]}
    outcome |= {"policy_candidates": [steps, table], "no_table": []}
    outcome["tables"] = {"llama3.2-1b k-by-batch": TABLE}
    return plan, outcome


def test_capacity_emits_the_winning_table_not_the_plans_static_k(tmp_path, repo):
    # The table and SGLang's steps need 2 replicas, the static k 3, speculation off 4: the
    # table wins (the simpler of the two) and is what the files carry.
    replicas = {"static": 3, "adaptive": 3, "by_batch": 2, "steps": 2}
    plan, outcome = _capacity(tmp_path, repo, replicas, off=4)
    choice = emit_choice.capacity_choice(plan, outcome)
    assert (choice.drafter, choice.k, choice.rows, choice.static_k) == ("llama3.2-1b", 3, TABLE, 2)
    assert choice.reason.startswith("llama3.2-1b k-by-batch (2 replicas for 12 req/s by capacity)")
    assert [load.rate for load in choice.loads] == [6.0]  # each replica's share = capacity
    config = json.loads(_files(choice).report.attachments["engine/vllm.json"])
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 8, 3], [9, 96, 1]]


def test_capacity_emits_the_winning_engine_policy(tmp_path, repo):
    replicas = {"static": 3, "adaptive": 3, "by_batch": 3, "steps": 2}
    plan, outcome = _capacity(tmp_path, repo, replicas, off=4)
    choice = emit_choice.capacity_choice(plan, outcome)
    assert (choice.drafter, choice.k, choice.policy) == ("llama3.2-1b", 2, "adaptive_steps")
    request = emit.emit_request("sglang", None)
    assert emit.setting_for(choice, request).speculation.adaptive_steps is not None


@pytest.mark.parametrize(
    ("replicas", "off"),
    [
        ({"static": 2, "adaptive": 3, "by_batch": 2, "steps": 2}, 4),  # a tie: the static k
        ({"static": 3, "adaptive": 2, "by_batch": 3, "steps": 3}, 4),  # no engine runs it
        ({"static": 4, "adaptive": 4, "by_batch": 3, "steps": 3}, 3),  # no fewer than off
    ],
)
def test_capacity_keeps_its_own_choice_where_no_engine_policy_wins(tmp_path, repo, replicas, off):
    plan, outcome = _capacity(tmp_path, repo, replicas, off)
    choice = emit_choice.capacity_choice(plan, outcome)
    assert (choice.k, choice.rows, choice.policy) == (2, [], None)
    assert choice.reason.startswith("llama3.2-1b k=2 (")


# -- report drafter-swap --------------------------------------------------------------------------


def _entry(load: float, best_k: int, e2e: dict[str, float]):
    """A load's results by config, judged by mean E2E (lower is better)."""
    entry = window.LoadResult(load, best_k=best_k, best_config=f"k={best_k}")
    for config, seconds in e2e.items():
        summary = {"e2e_s": {"mean": seconds}}
        entry.by_config[config] = SimpleNamespace(ok=True, summary=summary)
    return entry


def test_swap_emits_the_recommended_drafters_winning_table(tmp_path, repo):
    scenario = write_scenario(tmp_path, repo, requests=100)
    own = window.prepare(str(scenario), [], [0, 1, 2, 3], [2.0, 4.0], None)
    drafter = SimpleNamespace(name="llama3.2-1b", drafter_name="llama3.2-1b", plan=own, tree=None)
    plan = SimpleNamespace(drafters=[drafter], first=own, scenario_path=str(scenario))
    e2e = {"k=0": 10.0, "k=2": 9.0, "by_batch": 8.0}
    loads = [_entry(2.0, 2, e2e), _entry(4.0, 2, e2e)]
    figures = {"static": 9.0, "by_batch": 8.0}
    policies = [{"load": e.load, "figures": {"llama3.2-1b": figures}} for e in loads]
    outcome = {"recommended": "llama3.2-1b", "per_drafter": {"llama3.2-1b": loads}}
    outcome |= {"policies": policies, "tables": {"llama3.2-1b": TABLE}}
    choice = emit_choice.swap_choice(plan, outcome)
    assert (choice.k, choice.rows, choice.static_k) == (3, TABLE, 2)
    assert "with its k-by-batch table" in choice.reason
    config = json.loads(_files(choice).report.attachments["engine/vllm.json"])
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 8, 3], [9, 96, 1]]
    # Within the tie band of the static k (2 % of mean E2E), the simpler static k stays.
    figures["by_batch"] = 8.9
    choice = emit_choice.swap_choice(plan, outcome)
    assert (choice.k, choice.rows) == (2, [])
