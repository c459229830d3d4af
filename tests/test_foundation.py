"""The shared foundation: one-line errors, atomic outputs, schema validation, overrides, latency."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import numpy as np
import pydantic
import pytest
import yaml

from specsim.cli import main
from specsim.config import StrictModel, apply_overrides, load_yaml_as, parse_override, validate_as
from specsim.errors import SpecsimError
from specsim.fileio import atomic_output_dir, read_yaml, write_text_atomic
from specsim.profile import (
    Latency,
    LatencyFit,
    LatencyModel,
    OutOfRangeWarning,
    ValidRange,
    load_profile,
)


class Inner(StrictModel):
    k: int = 0
    rate: float = 1.0


class Outer(StrictModel):
    name: str
    inner: Inner = Inner()


def test_error_is_one_line_with_file_key_fix():
    err = SpecsimError("bad\nvalue", file="a.yaml", key="x.y", fix="use 3")
    assert str(err) == "a.yaml: x.y: bad value; fix: use 3"
    assert "\n" not in str(err)


def test_unknown_key_names_file_and_key(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("name: a\ninner:\n  kk: 3\n")
    with pytest.raises(SpecsimError) as info:
        load_yaml_as(Outer, path)
    assert str(path) in str(info.value)
    assert info.value.key == "inner.kk"
    assert "remove the key" in str(info.value)


def test_wrong_type_is_reported_with_value(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("name: a\ninner:\n  k: three\n")
    with pytest.raises(SpecsimError) as info:
        load_yaml_as(Outer, path)
    assert info.value.key == "inner.k"
    assert "'three'" in str(info.value) and info.value.fix
    path.write_text("name: a\ninner:\n  k: 1.5\n")
    with pytest.raises(SpecsimError) as info:
        load_yaml_as(Outer, path)
    assert info.value.key == "inner.k" and info.value.fix == "give a whole number"


def test_overrides_are_type_checked(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("name: a\n")
    assert load_yaml_as(Outer, path, ["inner.k=3"]).inner.k == 3
    with pytest.raises(SpecsimError) as info:
        load_yaml_as(Outer, path, ["inner.k=abc"])
    assert info.value.key == "inner.k"
    assert "--set" in str(info.value)


def test_override_parsing_and_errors():
    assert parse_override("a.b=0.5") == (["a", "b"], 0.5)
    assert parse_override("a=[1, 2]") == (["a"], [1, 2])
    with pytest.raises(SpecsimError):
        parse_override("a.b")
    with pytest.raises(SpecsimError):
        parse_override("a..b=1")
    with pytest.raises(SpecsimError):
        apply_overrides({"a": 1}, ["a.b=2"])
    original = {"a": {"b": 1}}
    assert apply_overrides(original, ["a.c=2"]) == {"a": {"b": 1, "c": 2}}
    assert original == {"a": {"b": 1}}


def test_overrides_index_lists_that_exist():
    pools = {"fleet": {"pools": [{"name": "a", "k": 1}, {"name": "b"}]}}
    changed = apply_overrides(pools, ["fleet.pools.1.k=3", "fleet.pools.0.spec.t=0.5"])
    assert changed["fleet"]["pools"] == [
        {"name": "a", "k": 1, "spec": {"t": 0.5}},
        {"name": "b", "k": 3},
    ]
    for bad in ("fleet.pools.2.k=3", "fleet.pools.x.k=3", "fleet.pools.-1.k=3"):
        with pytest.raises(SpecsimError, match="not an index") as info:
            apply_overrides(pools, [bad])
        assert info.value.fix == "use an index from 0 to 1"


def test_a_bracketed_key_is_named_in_full(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("name: a\n")
    with pytest.raises(SpecsimError) as info:
        load_yaml_as(Outer, path, ["inner[0].k=1"])
    assert info.value.key == "inner[0]"


class Named(StrictModel):
    drafters: dict[str, Inner] = pydantic.Field(default_factory=dict)

    @pydantic.model_validator(mode="after")
    def _at_most_two(self):
        if len(self.drafters) > 2:
            raise ValueError("at most two drafters")
        if "x" in self.drafters:
            raise ValueError("'x' is reserved; fix: rename it")
        return self


def test_list_length_errors_say_which_way_to_fix():
    class Rates(StrictModel):
        per_position: list[float] = pydantic.Field(min_length=1, max_length=2)

    with pytest.raises(SpecsimError) as info:
        validate_as(Rates, {"per_position": []}, "p.yaml")
    assert info.value.key == "per_position" and info.value.fix == "give more items"
    with pytest.raises(SpecsimError) as info:
        validate_as(Rates, {"per_position": [0.1, 0.2, 0.3]}, "p.yaml")
    assert info.value.fix == "give fewer items"


def test_hyphenated_keys_stay_in_the_dotted_key():
    # A drafter named like a Hugging Face model holds hyphens: its name is part of the key.
    with pytest.raises(SpecsimError) as info:
        validate_as(Named, {"drafters": {"qwen2.5-0.5b": {"kk": 1}}}, "p.yaml")
    assert info.value.key == "drafters.qwen2.5-0.5b.kk"


def test_model_validator_message_reads_as_a_sentence_with_a_fix():
    with pytest.raises(SpecsimError) as info:
        validate_as(Named, {"drafters": {"a": {}, "b": {}, "c": {}}}, "p.yaml")
    assert info.value.message == "at most two drafters"
    assert info.value.fix
    with pytest.raises(SpecsimError) as info:
        validate_as(Named, {"drafters": {"x": {}}}, "p.yaml")
    assert (info.value.message, info.value.fix) == ("'x' is reserved", "rename it")


@pytest.mark.parametrize(
    ("text", "message"),
    [("", "empty"), ("- 1\n- 2\n", "mapping"), ("a: [1\n", "invalid YAML")],
)
def test_bad_yaml_files(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SpecsimError, match=message) as info:
        read_yaml(path)
    assert info.value.file == str(path) and info.value.fix


def test_folder_and_bad_override_errors_name_a_fix(tmp_path):
    with pytest.raises(SpecsimError, match="found a folder") as info:
        read_yaml(tmp_path)
    assert info.value.fix
    for override in ("=3", "a..b=1"):
        with pytest.raises(SpecsimError, match="empty") as info:
            parse_override(override)
        assert info.value.file == "--set" and info.value.fix
    with pytest.raises(SpecsimError, match="not a section") as info:
        apply_overrides({"a": 1}, ["a.b=2"])
    assert info.value.key == "a.b" and info.value.fix


def test_missing_and_non_utf8_files(tmp_path):
    with pytest.raises(SpecsimError, match="not found"):
        read_yaml(tmp_path / "nope.yaml")
    path = tmp_path / "latin.yaml"
    path.write_bytes(b"a: \xe9\n")
    with pytest.raises(SpecsimError, match="UTF-8"):
        read_yaml(path)


def test_atomic_output_dir_leaves_nothing_on_error(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError), atomic_output_dir(out) as staging:
        (staging / "summary.json").write_text("{}")
        raise RuntimeError("simulated failure half way")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_atomic_output_dir_moves_files_on_success(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("old")
    with atomic_output_dir(out) as staging:
        (staging / "sub").mkdir()
        (staging / "sub" / "a.csv").write_text("x\n")
    assert (out / "sub" / "a.csv").read_text() == "x\n"
    assert (out / "keep.txt").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_write_text_atomic_replaces(tmp_path):
    path = tmp_path / "f.txt"
    write_text_atomic(path, "one")
    write_text_atomic(path, "two")
    assert path.read_text() == "two"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def _latency(**fit) -> Latency:
    return Latency(
        fit=LatencyFit(**fit),
        valid_range=ValidRange(batch=(1, 8), context=(0, 1024), new_tokens=(1, 16)),
    )


def test_latency_formula_by_hand():
    model = LatencyModel(
        _latency(
            fixed_s=1e-3,
            per_sequence_s=1e-5,
            per_batched_token_s=1e-4,
            knee_tokens=4,
            per_kv_token_s=1e-7,
            per_attention_pair_s=1e-9,
        ),
        "target",
    )
    context = np.array([100, 300])
    new = np.array([5, 1])
    # N = 6 tokens, 2 above the knee; KV = 400; pairs = 5*(100+3) + 1*(300+1) = 816
    expected = 1e-3 + 2e-5 + 2 * 1e-4 + 400 * 1e-7 + 816 * 1e-9
    assert model.pass_seconds(context, new) == pytest.approx(expected, rel=1e-12)
    # Below the knee a pass is flat in the number of new tokens (memory-bound).
    flat = [model.pass_seconds(np.array([0]), n) for n in (1, 2, 3, 4)]
    assert np.allclose(np.diff(flat), [1e-9 * (n + 1) for n in (2, 3, 4)], rtol=1e-9)
    assert model.pass_seconds(np.array([], dtype=int), 1) == 0.0


def test_out_of_range_extrapolates_and_warns_once():
    model = LatencyModel(_latency(fixed_s=1e-3, per_kv_token_s=1e-6), "target", "p.yaml")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = model.pass_seconds(np.array([4096]), 1)
        b = model.pass_seconds(np.array([8192]), 1)
    assert a == pytest.approx(1e-3 + 4096e-6)
    assert b == pytest.approx(1e-3 + 8192e-6)
    assert [w.category for w in caught] == [OutOfRangeWarning]
    assert "p.yaml" in str(caught[0].message)


def test_out_of_range_error_rule():
    latency = _latency(fixed_s=1e-3)
    latency.outside_range = "error"
    model = LatencyModel(latency, "drafters.small", "p.yaml")
    model.pass_seconds(np.array([10] * 8), 1)
    with pytest.raises(SpecsimError) as info:
        model.pass_seconds(np.array([10] * 9), 1)
    assert info.value.key == "drafters.small.latency.valid_range"


def test_cli_help_and_bad_input_exit_code(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    assert "schema" in capsys.readouterr().out
    assert main(["schema", "profile"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["title"] == "specsim profile"
    assert "acceptance" in schema["properties"]
    proc = subprocess.run(
        [sys.executable, "-m", "specsim", "schema", "nonsense"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2


@pytest.mark.parametrize(
    "argv",
    [
        ["bogus"],
        ["check", "sampler", "--control", "nosuch"],
        ["plan", "window", "s.yaml", "--k", "-1..2", "--loads", "2", "--out", "x"],
    ],
)
def test_usage_errors_are_one_line_with_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "usage" not in err
    assert "error:" in err and "fix: see specsim" in err


def test_profile_refuses_duplicate_acceptance_entries(repo, tmp_path):
    data = read_yaml(repo / "profiles" / "llama3.1-8b_llama3.2-1b_h100-roofline.yaml")
    data["acceptance"].append(dict(data["acceptance"][0]))
    path = tmp_path / "dup.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecsimError) as info:
        load_profile(path)
    assert "two acceptance entries" in str(info.value)
    assert str(path) in str(info.value)
    data["acceptance"].pop()
    path.write_text(yaml.safe_dump(data))
    assert load_profile(path).name == data["name"]


def test_building_the_whole_parser_imports_no_numerical_library():
    # Every `specsim` call builds the parser; the numerical libraries load only with the work.
    code = (
        "import sys; from specsim.cli import build_parser; build_parser(); "
        "print(sorted(m for m in ('numpy', 'pandas', 'scipy', 'torch') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"
