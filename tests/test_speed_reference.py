"""The reference clock behind one interface (``specsim.engine.speed_reference``) and its one
profile block, ``provenance.speed_reference``: older profiles' flat keys are read into it, the
shipped files carry it, and the profiler's and the engine's references travel through it."""

from __future__ import annotations

import copy
import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from specsim.errors import SpecsimError
from specsim.profile import load_profile
from specsim.profile.provenance import FLAT_SPEED_KEYS, SpeedReference
from specsim.profile.schema import Profile

ROOT = Path(__file__).resolve().parent.parent
BUILTIN = ROOT / "profiles" / "builtin-cpu.yaml"


def flattened(data: dict) -> dict:
    """A profile as written before the block existed: its keys flat in ``provenance``."""
    old = copy.deepcopy(data)
    block = old["provenance"].pop("speed_reference")
    names = {new: flat for flat, new in FLAT_SPEED_KEYS.items()}
    old["provenance"].update({names[key]: value for key, value in block.items()})
    return old


def test_an_older_profiles_flat_keys_are_read_into_the_block(tmp_path):
    data = yaml.safe_load(BUILTIN.read_text(encoding="utf-8"))
    old = flattened(data)
    assert set(FLAT_SPEED_KEYS) <= set(old["provenance"])  # all six, as the old profile had them
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(old), encoding="utf-8")
    upgraded, current = load_profile(path).profile, load_profile(BUILTIN).profile
    assert upgraded.model_dump() == current.model_dump()  # the whole profile, so every number
    speed = upgraded.provenance.speed_reference
    assert speed.decode_s == old["provenance"]["reference_pass_s"]
    assert speed.prefill_s == old["provenance"]["reference_prefill_s"]
    assert speed.host_s == old["provenance"]["reference_host_s"]
    assert (
        speed.drafters["tiny"].decode_s
        == old["provenance"]["drafter_references"]["tiny"]["decode_s"]
    )
    assert speed.slowdown == old["provenance"]["reference_slowdown"]
    assert speed.overhead_pass_scale == old["provenance"]["overhead_pass_scale"]
    # An old profile with only some of the keys (before the prefill and host probes existed).
    partial = Profile.model_validate(
        {
            **data,
            "provenance": {**data["provenance"], "speed_reference": None, "reference_pass_s": 2e-3},
        }
    )
    assert partial.provenance.speed_reference == SpeedReference(decode_s=2e-3)


def test_flat_keys_beside_the_block_are_a_one_line_error_with_the_fix(tmp_path):
    data = yaml.safe_load(BUILTIN.read_text(encoding="utf-8"))
    data["provenance"]["reference_slowdown"] = 1.0
    path = tmp_path / "both.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(SpecsimError) as info:
        load_profile(path)
    line = info.value.one_line()
    assert "\n" not in line and "reference_slowdown and speed_reference both given" in line
    assert "fix: keep speed_reference and drop the older flat keys" in line
    # A bad value under an old key is refused as firmly as under the block.
    old = flattened(yaml.safe_load(BUILTIN.read_text(encoding="utf-8")))
    old["provenance"]["reference_pass_s"] = -1.0
    path.write_text(yaml.safe_dump(old), encoding="utf-8")
    with pytest.raises(SpecsimError, match=r"speed_reference\.decode_s"):
        load_profile(path)


def test_no_shipped_file_carries_the_flat_keys():
    files = [*ROOT.glob("profiles/*.yaml"), *ROOT.glob("tests/data/*.yaml")]
    carrying = []
    for path in files:
        provenance = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("provenance", {})
        carrying += [f"{path.name}: {key}" for key in FLAT_SPEED_KEYS if key in provenance]
    assert carrying == []
    assert load_profile(BUILTIN).profile.provenance.speed_reference.decode_s > 0


torch = pytest.importorskip("torch")


def fake_model():
    """Enough of a model for the probes to be built (nothing is timed in these tests)."""
    return SimpleNamespace(config=SimpleNamespace(max_position=256), device=torch.device("cpu"))


def test_reference_timing_takes_the_stored_references_and_writes_the_block_back():
    from specsim.engine.speed_reference import ReferenceTiming

    stored = SpeedReference(
        decode_s=2e-3,
        prefill_s=8e-3,
        host_s=5e-4,
        drafters={"small": {"decode_s": 6e-4, "prefill_s": 1.2e-3}},
    )
    target, small, new = fake_model(), fake_model(), fake_model()
    timing = ReferenceTiming(target, {"small": small, "new": new}, stored)
    normaliser = timing.normaliser
    assert (normaliser.reference_s, normaliser.reference_prefill_s) == (2e-3, 8e-3)
    assert normaliser.host.reference_s == 5e-4
    assert normaliser.speed_of(small).references() == {"decode_s": 6e-4, "prefill_s": 1.2e-3}
    # A drafter the profile has no references for is calibrated at its first probe.
    assert normaliser.speed_of(new).unreferenced()
    alone = ReferenceTiming(target, {"small": small}, stored)
    block = SpeedReference.model_validate(alone.block(0.97))  # the schema takes what it writes
    assert block == stored.model_copy(update={"slowdown": 1.0, "overhead_pass_scale": 0.97})
    unstored = ReferenceTiming(target)  # the profiler: every reference calibrated
    assert normaliser is not unstored.normaliser and unstored.normaliser.reference_s is None


def test_run_engine_takes_one_clock_argument_and_the_names_map_to_it():
    from specsim.engine.clock import ProcessClock, WallClock, start_clock
    from specsim.engine.run import run_engine
    from specsim.engine.speed_reference import ReferenceClockSetting, clock_setting

    parameters = inspect.signature(run_engine).parameters
    assert "clock" in parameters and not [p for p in parameters if "reference" in p]
    stored = SpeedReference(decode_s=1e-3)
    assert clock_setting("wall", stored) == "wall" and clock_setting("cpu", stored) == "cpu"
    assert clock_setting("reference", stored) == ReferenceClockSetting(stored)
    for name, kind in (("wall", WallClock), ("cpu", ProcessClock)):
        clock = start_clock(name)
        assert type(clock) is kind and clock.report() is None  # nothing for the summary


def test_the_reference_pass_loads_through_the_loader_as_it_stands_when_called(monkeypatch):
    """The probe module may be imported first while a caller has replaced the model loader (the
    bad-input corpus refuses loading); it must not keep that loader for later callers."""
    pytest.importorskip("torch")
    from specsim.engine.speed_reference import probes

    seen = []

    def loader(spec, device, dtype):
        seen.append(spec)
        raise RuntimeError("stop here")

    monkeypatch.setattr("specsim.models.load_model", loader)
    with pytest.raises(RuntimeError, match="stop here"):
        probes.ReferencePass.load("builtin:small", "cpu", "float32", now=lambda: 0.0)
    assert seen == ["builtin:small"]
