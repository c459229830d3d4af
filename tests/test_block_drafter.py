"""A block drafter end to end: the same drafter weights and acceptance, drafting its window in
one pass instead of k, moves the best window up (the shape P-EAGLE's authors report against
EAGLE-3: best K about 7 against about 3; docs/notes/2026-12-02-block-drafters.md).

The shipped Llama-3.1-8B / Llama-3.2-1B H100 roofline profile, with a second drafter that is
the 1B model's costs as a block drafter (``kind: block``) and the same assumed acceptance; one
H100 at 2 requests/s (about 2 in the batch), 60 s of the poisson scenario's traffic.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from specsim.errors import SpecsimError
from specsim.scenario import Scenario
from specsim.simulation import run_simulation

REPO = Path(__file__).parent.parent
PROFILE = REPO / "profiles" / "llama3.1-8b_llama3.2-1b_h100-roofline.yaml"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    profile = yaml.safe_load(PROFILE.read_text())
    block = copy.deepcopy(profile["drafters"]["llama3.2-1b"])
    block.update(kind="block", method="p_eagle", max_k=7)
    block.pop("overhead", None)
    profile["drafters"]["parallel"] = block
    same = [copy.deepcopy(a) for a in profile["acceptance"] if a["drafter"] == "llama3.2-1b"]
    profile["acceptance"] += [{**a, "drafter": "parallel"} for a in same]
    out = tmp_path_factory.mktemp("block")
    (out / "profile.yaml").write_text(yaml.safe_dump(profile))
    return out


def scenario(folder: Path, drafter: str, k: int) -> Scenario:
    data = yaml.safe_load((REPO / "scenarios" / "poisson.yaml").read_text())
    data["profile"] = "profile.yaml"
    data["workload"].update(rate=2.0, duration_s=60)
    data["speculation"].update(drafter=drafter, k=k)
    return Scenario.model_validate(data).with_source(folder / "scenario.yaml")


def tpot(folder: Path, drafter: str, k: int) -> float:
    return run_simulation(scenario(folder, drafter, k)).summary["tpot_s"]["mean"]


def test_one_pass_per_window_moves_the_best_window_up(folder):
    # Drafting k tokens in k passes: k = 3 beats k = 7 (each extra pass costs a 1B forward).
    assert tpot(folder, "llama3.2-1b", 3) < tpot(folder, "llama3.2-1b", 7)
    # In one pass the extra drafts cost a few query tokens: k = 7 beats k = 3.
    assert tpot(folder, "parallel", 7) < tpot(folder, "parallel", 3)
    # And at k = 7 the block drafter is faster than the same model drafting one by one.
    assert tpot(folder, "parallel", 7) < tpot(folder, "llama3.2-1b", 7)


def test_a_window_beyond_the_block_is_refused(folder):
    with pytest.raises(SpecsimError, match="at most 7") as raised:
        run_simulation(scenario(folder, "parallel", 8))
    assert raised.value.key == "speculation.k"


def test_the_planner_sweeps_no_window_beyond_the_block(folder, capsys):
    from specsim.cli import main

    path = folder / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario(folder, "parallel", 4).model_dump(mode="json")))
    out = folder / "plan"
    # Its acceptance answers 8 positions; its block, 7.
    assert main(["plan", "window", str(path), "--k", "0..8", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "k = 8 is beyond" in err and "answers k up to 7" in err and err.count("\n") == 1
    assert not out.exists()
