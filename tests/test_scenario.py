"""The scenario schema: validation, overrides, relative paths, pools, and the shipped files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specsim.cli import main
from specsim.errors import SpecsimError
from specsim.scenario import Scenario, load_scenario

REPO = Path(__file__).resolve().parent.parent
SHIPPED = sorted((REPO / "scenarios").glob("*.yaml"))


SIMULATOR_SCENARIOS = {"chat", "code", "poisson", "closed_loop", "drafter_swap"}


def test_every_shipped_scenario_validates_and_names_an_existing_profile():
    assert {p.stem for p in SHIPPED} >= SIMULATOR_SCENARIOS
    for path in SHIPPED:
        scenario = load_scenario(path)
        assert scenario.source == path
        if path.stem not in SIMULATOR_SCENARIOS:
            continue  # other scenarios may name profiles that are measured on demand
        assert scenario.resolve(scenario.profile).is_file(), path
        if scenario.workload.trace:
            assert scenario.resolve(scenario.workload.trace).is_file(), path


def test_overrides_are_type_checked():
    chat = REPO / "scenarios" / "poisson.yaml"
    scenario = load_scenario(chat, ["speculation.k=2", "workload.rate=4.5", "fleet.replicas=3"])
    assert scenario.speculation.k == 2 and scenario.workload.rate == 4.5
    assert scenario.fleet.total_replicas == 3
    with pytest.raises(SpecsimError, match=r"speculation\.k.*integer"):
        load_scenario(chat, ["speculation.k=lots"])
    with pytest.raises(SpecsimError, match=r"speculation\.policy"):
        load_scenario(chat, ["speculation.policy=sometimes"])


def test_workload_requirements():
    base = {"profile": "p.yaml"}
    with pytest.raises(ValueError, match="needs 'rate'"):
        Scenario.model_validate({**base, "workload": {"kind": "poisson", "requests": 3}})
    with pytest.raises(ValueError, match="'duration_s' or 'requests'"):
        Scenario.model_validate(
            {**base, "workload": {"kind": "closed_loop", "concurrency": 2,
                                  "prompt": {"dist": "fixed", "value": 1},
                                  "output": {"dist": "fixed", "value": 1}}}
        )  # fmt: skip
    with pytest.raises(ValueError, match="needs 'prompt' and 'output'"):
        Scenario.model_validate({**base, "workload": {"kind": "poisson", "rate": 1, "requests": 3}})
    with pytest.raises(ValueError, match="needs 'median'"):
        Scenario.model_validate(
            {**base, "workload": {"kind": "poisson", "rate": 1, "requests": 3,
                                  "prompt": {"dist": "lognormal"},
                                  "output": {"dist": "fixed", "value": 1}}}
        )  # fmt: skip


def test_a_runaway_request_count_is_refused_before_simulating():
    # rate 1e5 for 300 s would run until memory ran out; requests caps it, so that is allowed.
    base = {"profile": "p.yaml"}
    fixed = {"dist": "fixed", "value": 1}
    lengths = {"prompt": fixed, "output": fixed}
    with pytest.raises(ValueError, match=r"about 3e\+07 requests"):
        Scenario.model_validate(
            {**base, "workload": {"kind": "poisson", "rate": 1e5, "duration_s": 300, **lengths}}
        )
    capped = {"kind": "poisson", "rate": 1e5, "duration_s": 300, "requests": 100, **lengths}
    assert Scenario.model_validate({**base, "workload": capped}).workload.requests == 100
    with pytest.raises(ValueError, match="less than or equal to 10000000"):
        Scenario.model_validate(
            {**base, "workload": {"kind": "closed_loop", "concurrency": 20_000_000,
                                  "requests": 5, **lengths}}
        )  # fmt: skip


def test_pools_inherit_and_override_speculation():
    scenario = load_scenario(REPO / "scenarios" / "drafter_swap.yaml")
    pools = scenario.fleet.pools
    specs = [scenario.pool_speculation(p) for p in pools]
    assert [s.drafter for s in specs] == ["llama3.2-1b", "ngram"]
    assert all(s.verifier == scenario.speculation.verifier for s in specs)
    assert scenario.fleet.total_replicas == 2


def test_speculation_switches():
    def spec(**kw):
        return Scenario.model_validate(
            {"profile": "p", "workload": {"kind": "trace", "trace": "t"}, "speculation": kw}
        ).speculation

    assert not spec(k=0, drafter="d").enabled
    assert not spec(k=4).enabled  # no drafter: off
    assert spec(k=4, drafter="d").max_k == 4
    table = [{"max_batch": 8, "k": 3}, {"max_batch": 64, "k": 0}]
    assert spec(drafter="d", policy="by_batch", k_by_batch=table).max_k == 3
    with pytest.raises(ValueError, match="increasing"):
        spec(drafter="d", policy="by_batch", k_by_batch=table[::-1])
    with pytest.raises(ValueError, match="acceptance: iid"):
        spec(drafter="d", acceptance_rate=0.5)


def test_schema_command_documents_every_field(capsys):
    assert main(["schema", "scenario"]) == 0
    schema = json.loads(capsys.readouterr().out)
    defs = schema["$defs"]
    sections = ("Workload", "Engine", "Speculation", "SpeculationOverride", "Pool", "KByBatch")
    for section in (*sections, "Fleet", "Slo", "LengthDist", "Scenario"):
        props = schema["properties"] if section == "Scenario" else defs[section]["properties"]
        for name, prop in props.items():
            assert prop.get("description"), f"{section}.{name} has no description"
