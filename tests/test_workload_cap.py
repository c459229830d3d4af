"""workload.max_concurrency: the load-test client's cap on requests in flight (vLLM's and
SGLang's bench --max-concurrency), for open loops and traces."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from specsim.config import validate_as
from specsim.errors import SpecsimError
from specsim.scenario import Scenario
from specsim.simulation import run_simulation
from specsim.simulation.records import read_records
from specsim.workload import ClientCap

DATA = Path(__file__).parent / "data"
FIXED = {"prompt": {"dist": "fixed", "value": 120}, "output": {"dist": "fixed", "value": 40}}
BASE = {
    "seed": 5,
    "profile": "sim_profile.yaml",
    "workload": {"kind": "poisson", "rate": 40.0, "requests": 120, **FIXED},
    "engine": {"max_batch": 32},
    "speculation": {"drafter": "c05", "k": 3},
}


def scenario(**workload) -> Scenario:
    data = copy.deepcopy(BASE)
    data["workload"] = workload or data["workload"]
    return Scenario.model_validate(data).with_source(DATA / "scenario.yaml")


def records(tmp_path: Path, case: Scenario, name: str) -> dict[str, np.ndarray]:
    run_simulation(case, records_path=tmp_path / f"{name}.csv")
    return read_records(tmp_path / f"{name}.csv")


class Sent:
    def __init__(self, arrival: float):
        self.arrival = arrival


def test_the_cap_sends_while_a_slot_is_free_and_retimes_a_waiting_request():
    sent: list[Sent] = []
    cap = ClientCap(2, sent.append)
    first, second, third = Sent(0.0), Sent(0.1), Sent(0.2)
    for request in (first, second, third):
        cap.dispatch(request)
    assert sent == [first, second]  # the third waits at the client
    cap.on_finish(0.7)
    assert sent[-1] is third and third.arrival == 0.7  # sent, and timed, when a slot freed
    cap.on_finish(0.9)
    cap.dispatch(Sent(1.0))  # a slot is free again: sent at once, its time kept
    assert len(sent) == 4 and sent[-1].arrival == 1.0


def test_a_capped_open_loop_never_holds_more_in_flight_and_waits_only_for_a_slot(tmp_path):
    free = records(tmp_path, scenario(), "free")
    capped = records(tmp_path, scenario(**BASE["workload"], max_concurrency=4), "capped")
    order = np.argsort(capped["arrival_s"], kind="stable")
    sends, finishes = capped["arrival_s"][order], np.sort(capped["finish_s"])
    # Requests in flight just after each send: sent so far minus finished by then.
    in_flight = np.arange(1, sends.size + 1) - np.searchsorted(finishes, sends, side="right")
    assert in_flight.max() == 4  # the cap binds at rate 40/s on this profile, and holds
    # A request sent late was sent the moment a request finished (a slot freed), never later.
    due = np.sort(free["arrival_s"])  # the same schedule without the cap
    late = sends > due + 1e-9
    assert late.sum() > 10
    assert np.all(np.isin(np.round(sends[late], 6), np.round(capped["finish_s"], 6)))
    assert np.all(sends >= due - 1e-9)


def test_a_cap_above_the_request_count_changes_nothing(tmp_path):
    free = tmp_path / "free.csv"
    run_simulation(scenario(), records_path=free)
    capped = tmp_path / "capped.csv"
    run_simulation(scenario(**BASE["workload"], max_concurrency=120), records_path=capped)
    assert free.read_bytes() == capped.read_bytes()


def test_all_at_once_with_a_cap_is_a_closed_loop_of_that_many_clients(tmp_path):
    trace = tmp_path / "at_once.csv"
    rows = "".join("0.0,120,40\n" for _ in range(60))
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + rows)
    capped = scenario(kind="trace", trace=str(trace), max_concurrency=6)
    closed = scenario(kind="closed_loop", concurrency=6, requests=60, **FIXED)
    a, b = records(tmp_path, capped, "capped"), records(tmp_path, closed, "closed")
    for column in ("arrival_s", "first_token_s", "finish_s", "accepted"):
        np.testing.assert_array_equal(a[column], b[column])


def test_a_closed_loop_takes_no_cap():
    data = copy.deepcopy(BASE)
    data["workload"] = {"kind": "closed_loop", "concurrency": 3, "requests": 9, **FIXED}
    validate_as(Scenario, data, "s.yaml")
    data["workload"]["max_concurrency"] = 2
    with pytest.raises(SpecsimError, match="concurrency' clients instead"):
        validate_as(Scenario, data, "s.yaml")
