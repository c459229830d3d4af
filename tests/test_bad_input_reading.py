"""Bad input files: whatever their structure, one clean line, exit 2, nothing written.

Each case is a file that once gave a traceback, a hang or a silent acceptance in the readers
(YAML, JSON, CSV) every command goes through.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specsim.cli import main
from specsim.errors import SpecsimError
from specsim.parsing import parse_json, parse_yaml

REPO = Path(__file__).resolve().parent.parent
PROFILE = REPO / "profiles" / "llama3.1-8b_llama3.2-1b_h100-roofline.yaml"
SCENARIO = f"""profile: {PROFILE}
workload:
  kind: poisson
  rate: 4.0
  requests: 20
  prompt: {{dist: fixed, value: 100}}
  output: {{dist: fixed, value: 20}}
speculation: {{drafter: llama3.2-1b, k: 2}}
"""


def refused(argv: list[str], capsys, *names: str) -> str:
    """Run the command; it exits 2 with one line naming ``names`` and a fix."""
    code = main([str(a) for a in argv])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2, lines
    assert len(lines) == 1 and "; fix: " in lines[0], lines
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


def simulate_refused(tmp_path: Path, text: str, capsys, *names: str) -> str:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(text)
    line = refused(["simulate", scenario, "--out", tmp_path / "out"], capsys, *names)
    assert not (tmp_path / "out").exists()
    return line


def alias_bomb(levels: int = 7) -> str:
    lines = ['l0: &l0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "extra, names",
    [
        ("seed: 1\nseed: 2\n", ("line 10", "'seed' given twice", "keep one")),
        ("description: " + "[" * 5000 + "\n", ("nested deeper than 100 levels",)),
        ("seed: " + "9" * 5000 + "\n", ("line 9", "an integer of 5000 characters")),
        (alias_bomb(), ("once aliases are expanded",)),
        ("description: &a {x: *a}\n", ("an alias refers to a node that holds it",)),
    ],
    ids=["duplicate-key", "deep-nesting", "huge-integer", "alias-bomb", "self-alias"],
)
def test_a_scenario_file_past_what_any_holds_is_refused(tmp_path, capsys, extra, names):
    simulate_refused(tmp_path, SCENARIO + extra, capsys, "s.yaml", *names)


def test_merge_keys_and_overriding_a_merged_key_still_read():
    data = parse_yaml("base: &b {k: 1, m: 3}\nother:\n  <<: *b\n  k: 2\n", "f.yaml")
    assert data["other"] == {"k": 2, "m": 3}
    with pytest.raises(SpecsimError, match="'1' given twice"):
        parse_yaml("1: a\n1: b\n", "f.yaml")


def test_a_set_override_with_a_huge_integer_names_the_key(tmp_path, capsys):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(SCENARIO)
    argv = ["simulate", scenario, "--out", tmp_path / "out", "--set", "seed=" + "9" * 5000]
    refused(argv, capsys, "--set", "seed")


@pytest.mark.parametrize(
    "text, problem",
    [
        ("[" * 100_000, "nested too deeply"),
        ('{"a": ' + "9" * 5000 + "}", "an integer of 5000 digits"),
    ],
)
def test_json_past_the_parser_is_one_line(text, problem):
    with pytest.raises(SpecsimError, match=f"f.json: invalid JSON: {problem}; fix: repair it"):
        parse_json(text, "f.json", "repair it")


@pytest.mark.parametrize(
    "text, names",
    [
        ("[" * 100_000, ("nested too deeply",)),
        ('{"hidden_size": ' + "9" * 5000 + "}", ("5000 digits",)),
    ],
)
def test_a_model_config_past_the_parser_is_refused(tmp_path, capsys, text, names):
    (tmp_path / "config.json").write_text(text)
    argv = [
        "profile",
        "roofline",
        "--target",
        tmp_path,
        "--hardware",
        REPO / "profiles" / "hardware" / "h100-sxm.yaml",
    ]
    refused([*argv, "--out", tmp_path / "out"], capsys, "config.json", *names)


def test_a_bench_file_with_a_line_past_the_csv_limit_is_refused(tmp_path, capsys):
    long_line = tmp_path / "bench.txt"
    long_line.write_text("x" * 140_000 + "\n")
    long_cell = tmp_path / "bench.csv"
    long_cell.write_text('completed,duration_s\n"' + "x" * 140_000 + '",1\n')
    for bench, problem in ((long_line, "not a benchmark result"), (long_cell, "field limit")):
        argv = ["profile", "from-bench", bench, "--into", PROFILE, "--out", tmp_path / "o"]
        refused(argv, capsys, bench.name, problem)


def test_a_trace_with_a_cell_past_the_csv_limit_is_refused(tmp_path, capsys):
    trace = tmp_path / "trace.csv"
    trace.write_text('TIMESTAMP,ContextTokens,GeneratedTokens\n"' + "1" * 140_000 + '",1,1\n')
    text = SCENARIO.replace("  requests: 20\n", f"  requests: 20\n  trace: {trace}\n")
    text = text.replace("kind: poisson\n  rate: 4.0", "kind: trace")
    simulate_refused(tmp_path, text, capsys, "trace.csv", "field limit")


def test_a_safetensors_index_whose_weight_map_is_a_list_is_refused(tmp_path):
    from specsim.models.loader import _weight_files

    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": ["a"]}))
    with pytest.raises(SpecsimError, match=r"index.json: weight_map: malformed index"):
        _weight_files(tmp_path)


def test_a_scrape_whose_position_labels_skip_one_is_refused(tmp_path):
    from specsim.serving.prometheus import read_scrape

    lines = [
        "vllm:spec_decode_num_drafts_total 100",
        "vllm:spec_decode_num_draft_tokens_total 300",
        "vllm:spec_decode_num_accepted_tokens_total 120",
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 70',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 50',
    ]
    scrape = tmp_path / "metrics.txt"
    scrape.write_text("\n".join(lines) + "\n")
    with pytest.raises(SpecsimError, match=r"metrics.txt: .*position labels skip 1; fix: "):
        read_scrape(scrape)
    lines.insert(4, 'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 0')
    scrape.write_text("\n".join(lines) + "\n")
    assert read_scrape(scrape).speculation.k == 3


@pytest.mark.parametrize("steps, problem", [(-1, "negative"), (40, "past specsim.s bound of 32")])
def test_an_sglang_run_with_an_impossible_step_count_is_refused(tmp_path, steps, problem):
    from specsim.serving.detect import read_bench_files

    runs = (REPO / "tests" / "data" / "bench" / "sglang_two_runs.jsonl").read_text()
    bench = tmp_path / "sglang.jsonl"
    bench.write_text(
        runs.replace('"speculative_num_steps": 3', f'"speculative_num_steps": {steps}')
    )
    with pytest.raises(SpecsimError, match=f"speculative_num_steps: {steps}.*{problem}; fix: "):
        read_bench_files([bench])


def test_every_error_the_package_raises_says_how_to_fix_it():
    """Each ``SpecsimError(...)`` in the package passes ``fix=`` (or writes '; fix:' itself)."""
    import ast

    missing = []
    for path in sorted((REPO / "specsim").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = getattr(node, "func", None)
            if not (isinstance(node, ast.Call) and getattr(name, "id", None) == "SpecsimError"):
                continue
            words = [c.value for c in ast.walk(node) if isinstance(c, ast.Constant)]
            given = {k.arg for k in node.keywords}
            if not ({"fix", None} & given or any("; fix: " in str(w) for w in words)):
                missing.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not missing, missing
