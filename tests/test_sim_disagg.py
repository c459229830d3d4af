"""Disaggregated prefill and decode (``specsim.simulation.disagg``): transfer bytes and times
worked out by hand, a lone request's timeline replayed pass by pass, and a 1P1D fleet's
determinism, fast path and accounting."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import yaml
from test_sim_engine import LONE_REQUEST

from specsim.errors import SpecsimError
from specsim.hardware import load_hardware
from specsim.profile import load_profile
from specsim.profile.kinds import reads_hidden_states
from specsim.profiling.parallel import hardware_layout
from specsim.scenario import Scenario
from specsim.simulation import run_simulation
from specsim.simulation.disagg import KvLink, kv_link, transfer_bytes
from specsim.simulation.records import read_records

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).parent.parent
PROFILE_70B = REPO / "profiles" / "llama3.1-70b_llama3.2-1b_4xh100-tp4-roofline.yaml"

SPLIT = {
    "prefill": {"replicas": 1},
    "decode": {"replicas": 1},
    "kv_transfer": {"bandwidth_bytes_per_s": 1.0e9, "latency_s": 0.001},
}
BASE = {
    "seed": 5,
    "profile": "sim_profile.yaml",
    "workload": {
        "kind": "poisson",
        "rate": 15.0,
        "requests": 200,
        "prompt": {"dist": "uniform", "low": 50, "high": 400},
        "output": {"dist": "uniform", "low": 1, "high": 120},
    },
    "engine": {"max_batch": 32},
    "speculation": {"drafter": "c05", "k": 3},
    "fleet": {"disaggregation": SPLIT},
}


def make(data: dict | None = None, **fleet) -> Scenario:
    data = copy.deepcopy(BASE if data is None else data)
    data["fleet"]["disaggregation"].update(fleet)
    return Scenario.model_validate(data).with_source(DATA / "scenario.yaml")


def run(scenario: Scenario, tmp_path: Path, name: str = "r", **kwargs):
    path = tmp_path / f"{name}.csv"
    result = run_simulation(scenario, records_path=path, **kwargs)
    return result.summary, read_records(path)


DRAFTERS_READING = [
    ("draft_model", None),  # recomputes its own cache over the prompt
    ("ngram", None),
    ("heads", None),
    ("block", "dflash"),
    ("block", "pard"),
]


def test_transfer_bytes_follow_the_model_shape_and_the_drafter_kind():
    target = load_profile(PROFILE_70B).profile.target
    # Llama 3.1 70B: 80 layers x 8 KV heads x 128 head dims x (K and V) x 2 bytes (bf16).
    assert target.kv_bytes_per_token == 80 * 8 * 128 * 2 * 2 == 327_680
    assert transfer_bytes(target, False, 1000) == 327_680_000
    # Heads take the prompt's hidden states too: 8192 dims x 2 bytes per token.
    assert transfer_bytes(target, True, 1000) == 327_680_000 + 1000 * 8192 * 2
    # Which drafters read them: heads and the block drafters but PARD (a draft model of its own).
    assert [reads_hidden_states(*d) for d in DRAFTERS_READING] == [False, False, True, True, False]


def test_transfer_time_is_bytes_over_bandwidth_plus_latency_queued_per_sender(tmp_path):
    # H100 NVLink from the hardware file: 450 GB/s x efficiency 0.8 per device pair; TP4 on
    # both sides moves four shards at once; 1 us latency.
    scenario = Scenario.model_validate(
        {
            **copy.deepcopy(BASE),
            "fleet": {
                "disaggregation": {
                    **SPLIT,
                    "kv_transfer": {
                        "hardware": str(REPO / "profiles/hardware/h100-sxm.yaml"),
                        "link": "nvlink",
                    },
                }
            },
        }
    )
    link = kv_link(scenario, scenario.fleet.disaggregation, 4, 4)
    assert link.bandwidth == pytest.approx(450e9 * 0.8 * 4, rel=1e-15)
    first = link.send(0, 10.0, 327_680_000)
    assert first == pytest.approx(10.0 + 327_680_000 / 1.44e12 + 1e-6, rel=1e-15)
    # A second transfer from the same prefill replica waits for the first's bytes (not its
    # latency); one from another replica does not wait.
    second = KvLink(1.0e9, 0.5, pairs=1, senders=2)
    assert second.send(0, 0.0, 2.0e9) == 2.5
    assert second.send(0, 1.0, 1.0e9) == 3.5
    assert second.send(1, 1.0, 1.0e9) == 2.5


def test_kv_link_reads_the_hardware_file_as_the_roofline_does(tmp_path):
    """One schema for the hardware file: a file without an efficiency section gives the KV
    transfer the roofline's default interconnect efficiency (0.8), and its PCIe link is the
    one the roofline would all-reduce over when the file has no NVLink."""
    data = yaml.safe_load((REPO / "profiles/hardware/h100-sxm.yaml").read_text())
    data.pop("efficiency")
    data.pop("nvlink")
    data["pcie"] = {"bandwidth_bytes_per_s": 64.0e9, "latency_s": 2.0e-6}
    path = tmp_path / "pcie-only.yaml"
    path.write_text(yaml.safe_dump(data))
    transfer = {"hardware": str(path), "link": "pcie"}
    scenario = Scenario.model_validate(
        {
            **copy.deepcopy(BASE),
            "fleet": {"disaggregation": {**SPLIT, "kv_transfer": transfer}},
        }
    )
    link = kv_link(scenario, scenario.fleet.disaggregation, 2, 1)
    layout = hardware_layout(load_hardware(path), 2, None, None, str(path))
    assert layout.link_name == "PCIe" and layout.link_efficiency == 0.8
    assert link.bandwidth == pytest.approx(64.0e9 * layout.link_efficiency, rel=1e-15)
    assert link.latency == layout.link.latency_s == 2.0e-6


def test_a_lone_request_ttft_is_prefill_plus_transfer_plus_first_decode(tmp_path):
    """Acceptance 1 makes one request deterministic: prefill on the prefill replica (target
    only), the transfer, then the decode replica's iterations (the first one also runs the draft
    model's prompt pass and streams the first token), replayed with the profile's own passes."""
    profile = load_profile(DATA / "sim_profile_compute.yaml")
    target, draft = profile.latency_model("target"), profile.latency_model("small")
    overhead = profile.profile.overhead.per_step_s
    data = {**copy.deepcopy(LONE_REQUEST), "fleet": {"disaggregation": SPLIT}}
    summary, rec = run(make(data), tmp_path)
    clock = target.pass_seconds([0], [100]) + overhead  # the prefill replica's pass
    transfer = 100 * 131072 / 1.0e9 + 0.001  # 100 tokens x 131072 KV bytes over 1 GB/s
    clock += transfer
    context, remaining, first = 100, 19, None
    while remaining:
        drafts = min(3, remaining - 1)
        new = drafts + 1
        clock += target.pass_seconds([context], [new]) + overhead
        clock += sum(draft.pass_seconds([context + j], [1]) for j in range(3))
        if first is None:  # the draft model's own pass over the prompt rides in the first
            clock += draft.pass_seconds([0], [100])
            first = clock
        context += new
        remaining -= new
    assert rec["first_token_s"][0] == pytest.approx(first, abs=1e-6)  # CSV keeps microseconds
    assert rec["finish_s"][0] == pytest.approx(clock, abs=1e-6)
    assert (rec["pool"][0], rec["steps"][0], rec["accepted"][0]) == ("decode", 5, 14)
    split = summary["disaggregation"]
    assert split["transfers"] == 1 and split["transfer_bytes_mean"] == 100 * 131072
    assert split["transfer_s"]["mean"] == pytest.approx(transfer, rel=1e-6)
    assert split["transfer_share_of_ttft"] == pytest.approx(transfer / first, rel=1e-5)


def test_a_1p1d_run_is_deterministic_and_the_fast_path_matches_the_reference(tmp_path):
    a, _ = run(make(), tmp_path, "a")
    b, _ = run(make(), tmp_path, "b")
    reference, _ = run(make(), tmp_path, "ref", fast_path=False)
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "ref.csv").read_bytes()
    assert a == b == reference


def test_every_token_is_served_and_pools_are_reported(tmp_path):
    summary, rec = run(make(), tmp_path)
    assert len(rec["id"]) == 200
    assert (rec["accepted"] <= rec["drafted"]).all()
    # One-token outputs end on the prefill replica; every other request decodes on the
    # decode replica, whose steps emit output - 1 tokens (the prefill sampled the first).
    ones = rec["output_tokens"] == 1
    assert (rec["pool"][ones] == "prefill").all() and (rec["pool"][~ones] == "decode").all()
    decoded = ~ones
    emitted = rec["steps"][decoded] + rec["accepted"][decoded]
    assert (emitted == rec["output_tokens"][decoded] - 1).all()
    assert (rec["first_token_s"] > rec["arrival_s"]).all()
    split = summary["disaggregation"]
    assert split["transfers"] == int(decoded.sum())
    assert set(summary["pools"]) == {"prefill", "decode"}
    assert summary["scenario"]["drafter"] == "c05"  # the decode pool's speculation
    assert 0 < split["busy_fraction"]["prefill"] < 1 and 0 < split["busy_fraction"]["decode"] <= 1
    assert 0 < split["link_busy_fraction"] < 1
    from specsim.docs.outputs import DISAGG_SUMMARY_KEYS

    assert list(split) == list(DISAGG_SUMMARY_KEYS)  # every key documented, in order
    assert list(summary)[list(summary).index("pools") + 1] == "disaggregation"


def test_the_decode_cache_holds_transferred_prompts_and_preempts_when_full(tmp_path):
    data = copy.deepcopy(BASE)
    data["workload"]["rate"] = 60.0
    small = {"kv_capacity_tokens": 3000, "max_batch": 32}
    data["engine"] = small
    summary, rec = run(make(data), tmp_path)
    assert len(rec["id"]) == 200
    assert summary["pools"]["decode"]["preemptions"] > 0  # the transferred prompts filled it
    assert summary["pools"]["decode"]["kv_cache_utilisation"]["max"] <= 1.0
    reference, _ = run(make(data), tmp_path, "ref", fast_path=False)
    assert summary == reference


def test_routers_spread_over_both_pools(tmp_path):
    summary, rec = run(
        make(prefill={"replicas": 2}, decode={"replicas": 3}, decode_router="least_outstanding"),
        tmp_path,
    )
    assert set(rec["replica"][rec["pool"] == "decode"].tolist()) == {2, 3, 4}
    assert summary["disaggregation"]["prefill_replicas"] == 2
    assert summary["scenario"]["replicas"] == 5


@pytest.mark.parametrize("drafter", ["ngram", "heads", "dflash"])
def test_drafter_kinds_move_their_own_bytes(tmp_path, drafter):
    profile = load_profile(DATA / "sim_profile.yaml").profile.model_dump(exclude_none=True)
    profile["target"]["hidden_size"] = 1024
    # A DFlash drafter reads the target's hidden states, as heads do.
    fit = {"fit": {"fixed_s": 0.001}}
    profile["drafters"]["dflash"] = {
        "kind": "block",
        "method": "dflash",
        "max_k": 4,
        "latency": fit,
    }
    profile["acceptance"].append(
        {"drafter": "dflash", "verifier": "rejection", "temperature": 1.0, "per_position": [0.7]}
    )
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(profile))
    data = copy.deepcopy(BASE)
    data["profile"] = str(path)
    data["speculation"] = {"drafter": drafter, "k": 2}
    summary, rec = run(make(data), tmp_path)
    split = summary["disaggregation"]
    prompts = rec["prompt_tokens"][rec["output_tokens"] > 1].astype(np.float64)
    kv = float(load_profile(path).profile.target.kv_bytes_per_token)
    per_token = kv + (1024 * 2 if drafter in ("heads", "dflash") else 0)
    assert split["drafter_kind"] == ("block" if drafter == "dflash" else drafter)
    # summary.json keeps 6 significant digits.
    assert split["transfer_bytes_mean"] == pytest.approx(prompts.mean() * per_token, rel=1e-5)


def test_heads_need_the_targets_hidden_size(tmp_path):
    data = copy.deepcopy(BASE)
    data["speculation"] = {"drafter": "heads", "k": 2}
    with pytest.raises(SpecsimError, match="hidden_size"):
        run(make(data), tmp_path)


def test_a_pool_profile_of_another_target_is_refused(tmp_path):
    with pytest.raises(SpecsimError, match="another target model") as info:
        run(make(decode={"replicas": 1, "profile": str(PROFILE_70B)}), tmp_path)
    assert info.value.key == "fleet.disaggregation.decode.profile"


def test_a_pool_tensor_parallel_size_its_profile_does_not_describe_names_the_pool(tmp_path):
    with pytest.raises(
        SpecsimError, match=r"fleet\.disaggregation\.decode\.tensor_parallel_size is 4"
    ):
        run(make(decode={"replicas": 1, "tensor_parallel_size": 4}), tmp_path)
    with pytest.raises(SpecsimError) as info:
        run(make(prefill={"replicas": 1, "tensor_parallel_size": 2}), tmp_path)
    assert info.value.key == "fleet.disaggregation.prefill.tensor_parallel_size"


@pytest.mark.parametrize(
    "fleet, message",
    [
        ({"pools": [{"name": "a"}]}, "no pools"),
        ({"replicas": 3}, "pools hold 2"),
    ],
)
def test_fleet_keys_are_checked(fleet, message):
    data = copy.deepcopy(BASE)
    data["fleet"].update(fleet)
    with pytest.raises(ValueError, match=message):
        Scenario.model_validate(data)


def test_kv_transfer_takes_figures_or_a_hardware_link_not_a_mix():
    data = copy.deepcopy(BASE)
    data["fleet"]["disaggregation"]["kv_transfer"] = {"latency_s": 0.1, "link": "nvlink"}
    with pytest.raises(ValueError, match="either bandwidth_bytes_per_s and latency_s"):
        Scenario.model_validate(data)


def test_a_transferred_prompt_takes_the_decode_cache_until_it_finishes(tmp_path):
    """Two 100-token prompts prefilled side by side (two prefill replicas) reach one decode
    replica at once; its 150-token cache holds one (100 + k + 1 = 104 slots, then 124 at
    most), so the second joins only when the first has finished."""
    data = {
        "profile": "sim_profile_compute.yaml",
        "workload": {
            "kind": "closed_loop",
            "concurrency": 2,
            "requests": 2,
            "prompt": {"dist": "fixed", "value": 100},
            "output": {"dist": "fixed", "value": 20},
        },
        "engine": {"kv_capacity_tokens": 150},
        "speculation": {"drafter": "small", "k": 3, "acceptance": "iid", "acceptance_rate": 1.0},
        "fleet": {"disaggregation": {**SPLIT, "prefill": {"replicas": 2}}},
    }
    summary, rec = run(make(data), tmp_path)
    first, second = np.argsort(rec["finish_s"])
    assert rec["first_token_s"][second] > rec["finish_s"][first]
    assert summary["pools"]["decode"]["preemptions"] == 0
    assert summary["disaggregation"]["transfers"] == 2
