"""One registry per choice a scenario makes (``specsim.choices``): window policies and routers.
The schema accepts exactly the registry's names and describes them from it, and the simulation
has one implementation per name; the routers route as their descriptions say."""

from __future__ import annotations

import numpy as np
import pytest

from specsim.choices import ROUTERS, WINDOW_POLICIES, Choice, check_implemented, schema_description
from specsim.scenario import Scenario, Speculation
from specsim.simulation.fleet import ROUTER_CLASSES, Fleet
from specsim.simulation.policy import WINDOW_POLICY_CLASSES, build_policy


def test_every_window_policy_and_router_has_one_implementation_under_its_name():
    assert list(WINDOW_POLICY_CLASSES) == list(WINDOW_POLICIES)
    assert list(ROUTER_CLASSES) == list(ROUTERS)
    for registry in (WINDOW_POLICY_CLASSES, ROUTER_CLASSES):
        assert all(cls.name == name for name, cls in registry.items())


def test_a_registry_name_without_an_implementation_fails_the_check():
    grown = {**WINDOW_POLICIES, "sometimes": Choice("sometimes", "k on odd iterations")}
    with pytest.raises(ImportError, match=r"none implements \['sometimes'\]"):
        check_implemented(grown, WINDOW_POLICY_CLASSES, "window policies")
    fewer = {name: c for name, c in ROUTERS.items() if name != "random"}
    with pytest.raises(ImportError, match=r"not in the registry: \['random'\]"):
        check_implemented(fewer, ROUTER_CLASSES, "routers")


def test_the_scenario_schema_takes_the_names_and_their_meanings_from_the_registries():
    defs = Scenario.model_json_schema()["$defs"]
    policy = defs["Speculation"]["properties"]["policy"]
    assert policy["enum"] == list(WINDOW_POLICIES)
    assert policy["description"] == schema_description(WINDOW_POLICIES)
    override = defs["SpeculationOverride"]["properties"]["policy"]["anyOf"]
    assert {"enum": list(WINDOW_POLICIES), "type": "string"} in override
    router = defs["Fleet"]["properties"]["router"]
    assert router["enum"] == list(ROUTERS)
    assert all(f"'{name}': {c.description}" in router["description"] for name, c in ROUTERS.items())


@pytest.mark.parametrize("name", list(WINDOW_POLICIES))
def test_each_policy_name_builds_its_class(name):
    table = [{"max_batch": 4, "k": 2}]
    data = {"drafter": "d", "k": 3, "k_by_batch": table, "policy": name}
    policy = build_policy(Speculation.model_validate(data), max_batch=8)
    assert type(policy) is WINDOW_POLICY_CLASSES[name]
    # A table's widest row; SGLang's adaptive steps size for its largest default candidate, 7.
    assert policy.k_max == {"by_batch": 2, "adaptive_steps": 7}.get(name, 3)


class Replica:
    def __init__(self, outstanding: int = 0):
        self.outstanding = outstanding


def picks(router: str, replicas: list[Replica], n: int, seed: int = 0) -> list[int]:
    fleet = Fleet(replicas, router, np.random.default_rng(seed))
    return [replicas.index(fleet.choose()) for _ in range(n)]


def test_round_robin_goes_in_turn():
    assert picks("round_robin", [Replica() for _ in range(3)], 7) == [0, 1, 2, 0, 1, 2, 0]


def test_least_outstanding_takes_the_fewest_queued_and_running_ties_to_the_lowest_index():
    replicas = [Replica(3), Replica(1), Replica(1), Replica(2)]
    assert picks("least_outstanding", replicas, 2) == [1, 1]  # nothing changed in between


def test_random_draws_uniformly_from_the_routing_stream():
    # 4,096 requests over 4 replicas: each count is 1,024 +- 28 (one standard deviation), so
    # the band below (6 sigma) is missed by chance with probability ~1e-8 per count.
    chosen = picks("random", [Replica() for _ in range(4)], 4096, seed=5)
    expected = np.random.default_rng(5).integers(0, 4, size=4096).tolist()
    assert chosen == expected  # one seeded draw per request, in order
    assert np.all(np.abs(np.bincount(chosen, minlength=4) - 1024) < 6 * 28)


def test_a_single_replica_takes_every_request_without_touching_the_stream():
    rng = np.random.default_rng(1)
    fleet = Fleet([Replica()], "random", rng)
    for _ in range(10):
        fleet.choose()
    assert rng.random() == np.random.default_rng(1).random()
