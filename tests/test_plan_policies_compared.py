"""``plan capacity --policies`` and ``report drafter-swap --policies``: the window policies
compared at the target rate and per load, on scenarios whose verdict follows from the inputs.

One acceptance rate for every draft position (``acceptance: iid``) fixes the verdict: at 0.03
a drafter's windows are nearly all rejected, so every policy that drafts is slower than
speculation off; at 0.95 a step emits about 3.7 tokens for k = 3, so speculation wins.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass

import pytest
from test_plan_support import write_scenario

from specsim.cli import main
from specsim.errors import SpecsimError
from specsim.planning.capacity.capacity_plan import Candidate
from specsim.planning.capacity.capacity_policies import verdict, words
from specsim.planning.policy_compare import compared_policies
from specsim.planning.window.window_policies import LABELS, banded

SLO = {"ttft_s": 0.5, "tpot_s": 0.01}
ACCEPT = ["--set", "speculation.acceptance=iid", "--set", "speculation.acceptance_rate="]
CAPACITY = ["--target-rps", "60", "--k", "2", "--tolerance", "0.2", "--workers", "1"]
SWAP = ["--drafter", "llama3.2-1b", "--drafter", "ngram", "--k", "0..2", "--loads", "2,20"]
ALL = "by_batch,adaptive,adaptive_steps"


def _cli(command: list[str], out, rate: float | None, policies: str | None) -> dict:
    args = [*command, "--no-progress", "--out", str(out)]
    if rate is not None:
        args += [*ACCEPT[:3], f"{ACCEPT[3]}{rate}"]
    if policies is not None:
        args += ["--policies", policies]
    assert main(args) == 0
    return json.loads((out / "summary.json").read_text())


@pytest.fixture(scope="module")
def scenario(tmp_path_factory, repo):
    return write_scenario(
        tmp_path_factory.mktemp("policies"), repo, rate=10.0, requests=100, slo=SLO
    )


@pytest.fixture(scope="module")
def capacity(scenario):
    runs = {}
    for rate, policies in ((0.03, ALL), (0.95, ALL), (0.95, None)):
        out = scenario.parent / f"cap-{rate}-{policies}"
        command = ["plan", "capacity", str(scenario), *CAPACITY]
        runs[(rate, policies)] = (out, _cli(command, out, rate, policies))
    return runs


@pytest.fixture(scope="module")
def swap(tmp_path_factory, repo):
    # No SLO: judged by mean E2E, which a slower step moves at any load (goodput under an SLO
    # every run meets at 2 req/s would tie them all).
    scenario = write_scenario(tmp_path_factory.mktemp("swap"), repo, rate=10.0, requests=100)
    runs = {}
    for rate, policies in ((0.03, ALL), (0.95, ALL), (0.95, None)):
        out = scenario.parent / f"swap-{rate}-{policies}"
        command = ["report", "drafter-swap", str(scenario), *SWAP, "--workers", "1"]
        runs[(rate, policies)] = (out, _cli(command, out, rate, policies))
    return runs


def test_the_tie_band_goes_to_the_first_and_the_margin_is_a_fraction_of_the_next():
    # Higher is better; band 2 %: 0.99 is within 2 % of 1.0, 0.97 is not.
    assert banded({"a": 0.99, "b": 1.0, "c": 0.5}, 0.02) == ("a", ["b"], pytest.approx(-0.01))
    assert banded({"a": 0.97, "b": 1.0}, 0.02) == ("b", [], pytest.approx(0.03 / 0.97))
    assert banded({}, 0.02) == (None, [], None)
    assert banded({"a": 2.0}, 0.02) == ("a", [], None)
    # Names in the simplicity order, whatever order they are given in.
    assert compared_policies("adaptive_steps,static,by_batch", "x") == (
        "static", "by_batch", "adaptive_steps",
    )  # fmt: skip
    with pytest.raises(SpecsimError, match="'fixed' is not a policy x compares"):
        compared_policies("fixed", "x")


@dataclass
class _Result:
    """The fields of a ``CandidateResult`` the verdict reads."""

    candidate: Candidate
    replicas: int | None
    cost_per_hour: float | None
    capacity: float | None


class _Plan:
    target_rps = 10.0
    deployments = ()

    def __init__(self, policies):
        self.policies = policies
        self.candidates = [Candidate("d adaptive", "d", 3, "adaptive")]


def _capacity_verdict(replicas: dict[str, int], off: int, policies=("adaptive_steps",)):
    """The verdict on hand-made results: $2 a replica, capacity 10 / replicas req/s."""

    def result(label, policy, n):
        drafter, k = (None, 0) if policy is None else ("d", 3)
        candidate = Candidate(label, drafter, k, policy or "fixed")
        return _Result(candidate, n, 2.0 * n, 10.0 / n)

    candidates = [result("off", None, off), result("d k=3", "fixed", replicas["static"])]
    candidates.append(result("d adaptive", "adaptive", replicas["adaptive"]))
    extra = [result("d adaptive_steps", "adaptive_steps", replicas["adaptive_steps"])]
    outcome = {"candidates": candidates, "policy_candidates": extra, "no_table": []}
    (level,) = verdict(_Plan(policies), outcome)
    return level


def test_capacity_fewest_replicas_win_and_equal_fleets_go_to_the_simpler_policy():
    level = _capacity_verdict({"static": 3, "adaptive": 2, "adaptive_steps": 2}, off=3)
    # Two policies need 2 replicas at the same cost: the goodput policy is the simpler.
    assert level["winner"]["policy"] == "adaptive"
    assert [t["policy"] for t in level["tied_with"]] == ["adaptive_steps"]
    assert (level["margin_replicas"], level["margin"]) == (0, 0.0)
    assert level["winner_beats_off"] is True
    by = {i["policy"]: i for i in level["by_policy"]}
    assert [by[p]["more_replicas_than_off"] for p in ("static", "adaptive")] == [False, False]
    # One replica fewer is a win however complex the policy: by 1 replica, 3 / 2 - 1 = +50 %
    # capacity per device over the next (the goodput policy's 2).
    level = _capacity_verdict({"static": 4, "adaptive": 3, "adaptive_steps": 2}, off=3)
    assert level["winner"]["policy"] == "adaptive_steps" and level["tied_with"] == []
    assert (level["margin_replicas"], level["margin"]) == (1, pytest.approx(0.5))
    assert {i["policy"]: i["more_replicas_than_off"] for i in level["by_policy"]} == {
        "static": True, "adaptive": False, "adaptive_steps": False,
    }  # fmt: skip
    # As many replicas as speculation off: the winner does not beat it.
    level = _capacity_verdict({"static": 3, "adaptive": 3, "adaptive_steps": 3}, off=3)
    assert (level["winner"]["policy"], level["winner_beats_off"]) == ("static", False)


def _item(policy: str, replicas: int, drafter: str = "d") -> dict:
    candidate = f"{drafter} {policy}"
    return {"drafter": drafter, "policy": policy, "candidate": candidate, "replicas": replicas}


def test_capacity_words_at_equal_replicas_say_they_tie_and_what_decides():
    def level(items, tied):
        cost = {i["candidate"]: c for i, c in items}
        by = [i | {"cost_usd_per_hour": cost[i["candidate"]]} for i, _ in items]
        for i in by:
            i |= {"replicas_without_speculation": 4, "more_replicas_than_off": False}
        names = [{k: i[k] for k in ("drafter", "policy", "candidate")} for i in by]
        return {
            "target_rps": 10.0, "by_policy": by, "winner": names[0], "winner_beats_off": True,
            "tied_with": [names[t] for t in tied], "margin_replicas": 0, "margin": -0.05,
        }  # fmt: skip

    # Equal replicas, the winner cheaper (another deployment): a tie on replicas, won on cost.
    text = words(level([(_item("static", 2), 24.0), (_item("by_batch", 2), 32.0)], []))
    assert text == (
        "At 10 req/s d with the best static k (d static) needs 2 replicas and ties on them "
        "with d with the k-by-batch table; it costs least ($24.00/hour against $32.00). "
        "Speculation off needs 4."
    )
    # Equal replicas and cost: no figure decides, the simpler policy does.
    items = [(_item("static", 2), 24.0), (_item("adaptive", 2), 24.0)]
    assert words(level(items, [1])).startswith(
        "At 10 req/s d with the best static k (d static) needs 2 replicas and ties on replicas "
        "and cost with d with the goodput policy; the simpler policy wins."
    )
    # The same policy of two drafters: the drafter given first.
    items = [(_item("static", 2), 24.0), (_item("static", 2, drafter="e"), 24.0)]
    assert "cost with e with the best static k; the drafter given first wins." in (
        words(level(items, [1]))
    )
    # Cheaper than one, as dear as another: cost, then simplicity.
    items = [(_item("static", 2), 24.0), (_item("by_batch", 2), 32.0)]
    items.append((_item("adaptive", 2), 24.0))
    assert (
        "it costs least ($24.00/hour against $32.00); at equal cost the simpler policy wins "
        in (words(level(items, [2])))
    )
    # No tie on replicas: the lead in replicas, as before.
    one = level([(_item("static", 2), 24.0), (_item("by_batch", 3), 36.0)], [])
    one |= {"margin_replicas": 1, "margin": 0.5}
    assert "needs the fewest replicas, 2, 1 fewer than the next (capacity per device +50.0%)" in (
        words(one)
    )


@pytest.mark.slow
def test_capacity_with_a_hopeless_drafter_every_policy_needs_more_than_off(capacity):
    out, summary = capacity[(0.03, ALL)]
    (level,) = summary["policies"]
    assert level["target_rps"] == 60
    by = {i["policy"]: i for i in level["by_policy"]}
    assert list(by) == ["static", "by_batch", "adaptive", "adaptive_steps"]
    off = summary["recommendation"]["replicas_without_speculation"]
    assert summary["recommendation"]["candidate"] == "speculation off"
    for name in ("static", "adaptive", "adaptive_steps"):
        assert by[name]["replicas"] > off and by[name]["more_replicas_than_off"] is True
    # At 3 % acceptance no batch size drafts: there is no table to run.
    assert by["by_batch"]["candidate"] is None and len(level["no_table"]) == 1
    assert level["winner_beats_off"] is False
    with (out / "policies.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["policy"] for r in rows] == [
        "best static k", "k-by-batch table", "goodput policy", "SGLang adaptive steps",
    ]  # fmt: skip
    assert "## Window policy at the target" in (out / "report.md").read_text()


@pytest.mark.slow
def test_capacity_with_a_strong_drafter_speculation_wins_and_the_option_only_adds(capacity):
    out, summary = capacity[(0.95, ALL)]
    (level,) = summary["policies"]
    assert level["winner_beats_off"] is True
    assert not any(i["more_replicas_than_off"] for i in level["by_policy"])
    # Each policy's capacity is its searched candidate's.
    searched = {c["label"]: c["capacity_rps"] for c in summary["candidates"]}
    for item in level["by_policy"]:
        if item["candidate"] in searched:
            assert item["capacity_rps"] == searched[item["candidate"]]
    # The policies run after the plan's own search: everything else is as without them.
    plain_out, plain = capacity[(0.95, None)]
    assert {k: v for k, v in summary.items() if k != "policies"} == plain
    for name in ("capacity.csv", "fleet.csv", "capacity_vs_k.csv"):
        assert (out / name).read_bytes() == (plain_out / name).read_bytes()
    assert not (plain_out / "policies.csv").exists()


@pytest.mark.slow
def test_swap_with_a_hopeless_acceptance_drafting_loses_to_off(swap):
    _, summary = swap[(0.03, ALL)]
    for choice in summary["policies"]:
        # The draft model drafts windows it nearly always rejects, under every policy (its
        # table is k = 0 at every batch size, so there is none to run).
        assert [p for p in choice["lose_to_off"] if p["drafter"] == "llama3.2-1b"] == [
            {"drafter": "llama3.2-1b", "policy": name}
            for name in ("static", "adaptive", "adaptive_steps")
        ]
        assert choice["static_k"]["llama3.2-1b"] > 0
        assert choice["winner_beats_off"] is False
        off = choice["speculation_off"]["llama3.2-1b"]  # no SLO: mean E2E, lower is better
        for pair in choice["lose_to_off"]:
            assert choice["figures"][pair["drafter"]][pair["policy"]] > off * 1.02


@pytest.mark.slow
def test_swap_with_a_strong_drafter_speculation_wins_and_the_option_only_adds(swap):
    out, summary = swap[(0.95, ALL)]
    for choice in summary["policies"]:
        # About 2.9 tokens a step at k = 2: every policy of the draft model beats k = 0.
        assert choice["winner"]["drafter"] == "llama3.2-1b" and choice["winner_beats_off"] is True
        assert not any(p["drafter"] == "llama3.2-1b" for p in choice["lose_to_off"])
        assert set(choice["figures"]["llama3.2-1b"]) == {
            "static", "by_batch", "adaptive", "adaptive_steps",
        }  # fmt: skip
    with (out / "policies.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["winner"] for r in rows] == [
        f"llama3.2-1b with the {LABELS[c['winner']['policy']]}" for c in summary["policies"]
    ]
    plain_out, plain = swap[(0.95, None)]
    assert {k: v for k, v in summary.items() if k != "policies"} == plain
    for name in ("per_load.csv", "drafters.csv", "sweep.csv"):
        assert (out / name).read_bytes() == (plain_out / name).read_bytes()
    assert "## Drafter and window policy per load" in (out / "report.md").read_text()


@pytest.mark.parametrize(
    "command, args, message",
    [
        ("capacity", ["--policies", "fastest"], "'fastest' is not a policy plan capacity compares"),
        # The profile's acceptance answers k up to 8; a tier of 9 steps is beyond it.
        ("capacity", ["--policies", "adaptive_steps", "--set", "speculation.policy=adaptive_steps",
                      "--set", "speculation.adaptive_steps="
                      "{tiers: [{min_batch: 1, candidate_steps: [3, 9]}]}"], "may choose 9 steps"),
        ("split", ["--policies", "by_batch", "--disaggregated"], "--policies does not apply"),
        ("swap", ["--policies", "static,,"], "an empty policy name"),
        ("swap", ["--policies", "fixed"], "'fixed' is not a policy report drafter-swap compares"),
    ],
)  # fmt: skip
def test_bad_policies_are_refused_in_one_line(scenario, command, args, message, capsys, tmp_path):
    base = ["plan", "capacity", str(scenario), *CAPACITY]
    if command == "swap":
        base = ["report", "drafter-swap", str(scenario), *SWAP]
    if command == "split":  # --disaggregated sizes the scenario's own speculation: no --k
        base = ["plan", "capacity", str(scenario), "--target-rps", "60"]
    code = main([*base, *args, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "--policies" in err
    assert err.count("\n") == 1 and not (tmp_path / "o").exists()


def test_the_api_refuses_bad_policies_before_any_run(scenario):
    from specsim import drafter_swap, plan_capacity

    with pytest.raises(SpecsimError, match="'nope' is not a policy plan capacity compares"):
        plan_capacity(scenario, target_rps=60, policies="nope")
    with pytest.raises(SpecsimError, match="'nope' is not a policy report drafter-swap compares"):
        drafter_swap(scenario, drafters=["llama3.2-1b", "ngram"], policies=["by_batch", "nope"])


def test_swap_ties_go_to_the_simpler_policy_then_the_first_drafter():
    from types import SimpleNamespace as NS

    from specsim.planning.swap.swap_policies import choices

    def entry(e2e: dict[str, float]):
        runs = {config: {"e2e_s": {"mean": v}} for config, v in e2e.items()}
        return NS(summary=runs.get)

    def drafter(name):
        return NS(name=name, tree=None, plan=NS(ks=[0, 1, 2]))

    plan = NS(
        first=NS(use_slo=False), loads=[1.0], policies=("adaptive",),
        drafters=[drafter("current"), drafter("candidate")],
    )  # fmt: skip
    # Mean E2E (lower is better), k = 0 at 1.0. The current drafter's goodput policy is 1 %
    # ahead of the candidate's k = 1, inside the 2 % band: the static k, the simpler, wins.
    per = {
        "current": [entry({"k=0": 1.0, "k=1": 0.9, "k=2": 1.03, "adaptive": 0.5})],
        "candidate": [entry({"k=0": 1.0, "k=1": 0.505, "k=2": 0.6, "adaptive": 0.505})],
    }
    (choice,) = choices(plan, per)
    assert choice["static_k"] == {"current": 1, "candidate": 1}
    assert choice["winner"] == {"drafter": "candidate", "policy": "static"}
    assert choice["tied_with"] == [
        {"drafter": "current", "policy": "adaptive"},
        {"drafter": "candidate", "policy": "adaptive"},
    ]
    # Its lead over the best other (0.5), as a fraction of that: behind by 1 %.
    assert choice["margin"] == pytest.approx(-0.005 / 0.5)
    assert choice["winner_beats_off"] is True and choice["lose_to_off"] == []
    # Equal figures at the same policy: the drafter given first. The current drafter's goodput
    # policy is 5 % behind its k = 0, beyond the band: a loss.
    per["current"] = [entry({"k=0": 1.0, "k=1": 0.505, "k=2": 1.03, "adaptive": 1.05})]
    (choice,) = choices(plan, per)
    assert choice["winner"] == {"drafter": "current", "policy": "static"}
    assert choice["lose_to_off"] == [{"drafter": "current", "policy": "adaptive"}]
