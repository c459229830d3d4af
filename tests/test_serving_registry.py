"""The engine registry (``specsim.serving.registry``): each entry is complete, every drafter kind
has each engine's method or a clear refusal, and code finds engines' parts through it alone."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from specsim.errors import SpecsimError
from specsim.planning.emit import emit
from specsim.profile.kinds import DRAFTER_KINDS
from specsim.serving import (
    bench_commands,
    detect,
    prometheus,
    registry,
    sglang_config,
    trtllm_config,
    vllm_config,
)
from specsim.serving.setting import ROLES, EngineSetting, ModelRef, Speculative

SPECSIM = Path(__file__).parent.parent / "specsim"
RATES = (0.8, 0.6, 0.45)
TARGET = ModelRef("target", "org/target", "given")
# One drafter of each deployed kind the method tables key: specsim's kinds, the target's MTP
# layers, and heads whose checkpoint says EAGLE-3.
DRAFTERS = {
    "draft_model": Speculative("d", "draft_model", 3, ModelRef("d", "org/small", "given"), RATES),
    "ngram": Speculative("ngram", "ngram", 3, None, RATES, ngram_size=3),
    "heads": Speculative(
        "h", "heads", 3, ModelRef("h", "org/eagle-heads", "given"), RATES, passes="autoregressive"
    ),
    "heads-eagle3": Speculative(
        "h3", "heads", 3, ModelRef("h3", "org/EAGLE3-x", "given"), RATES, passes="autoregressive"
    ),
    "mtp": Speculative("mtp", "heads", 3, None, RATES, method="mtp", passes="autoregressive"),
}


# The parallel drafters each engine's source has a method for (vLLM 0.33 SpeculativeConfig,
# SGLang 0.5.23 speculative_hook.py, TensorRT-LLM llm_args.py's decoding types).
BLOCK_METHODS = {
    "vllm": {"dflash", "dspark", "p_eagle", "pard"},
    "sglang": {"dflash", "dspark"},
    "trtllm": {"dflash", "dspark", "pard"},
}


def setting(spec: Speculative | None, role: str | None = None) -> EngineSetting:
    return EngineSetting(TARGET, 32, 2048, spec, role=role)


def test_every_entry_is_complete():
    assert registry.NAMES == ("vllm", "sglang", "trtllm")
    assert len({e.display for e in registry.ENGINES}) == len(registry.ENGINES)
    for engine in registry.ENGINES:
        assert engine.display and engine.version and engine.router and engine.files
        assert callable(engine.writer.render) and callable(engine.writer.refuses)
        # Every kind but the parallel drafters, which are keyed by their method: each engine
        # runs the methods its source lists (the rest it refuses, below).
        chain_kinds = set(DRAFTER_KINDS) - {"block"}
        assert chain_kinds | {"mtp", "heads-eagle3"} <= set(engine.methods), engine.name
        assert (
            set(engine.methods) - chain_kinds - {"mtp", "heads-eagle3"}
            == BLOCK_METHODS[engine.name]
        )
        assert all(v > 0 for v in engine.defaults.values()), engine.name
        assert len(set(engine.caps.keys)) == 2, engine.name
        for speculating in (False, True):
            batch, tokens, why = engine.caps.defaults(None, speculating)
            assert batch > 0 and tokens > 0 and engine.display in why, engine.name
        if engine.bench is not None:
            assert engine.bench.engine == engine.name
            assert bench_commands.CLIENTS[engine.name] is engine.bench
    # The bench clients and scrape readers the serving modules try are the registry's, in order.
    assert [e.bench for e in registry.ENGINES if e.bench] == list(bench_commands.CLIENTS.values())
    assert tuple(e.scrape for e in registry.ENGINES if e.scrape) == prometheus.SCRAPERS


@pytest.mark.parametrize("kind", list(DRAFTERS))
@pytest.mark.parametrize("engine", registry.ENGINES, ids=registry.NAMES)
def test_each_writer_renders_each_kind_into_its_listed_files(engine, kind):
    spec = DRAFTERS[kind]
    assert spec.deployed_kind == kind
    rendered = engine.writer.render(setting(spec), ["header"])
    assert rendered.engine == engine.name
    assert set(rendered.files) <= set(engine.files)
    assert f"'{engine.method(spec)}'" in str(rendered.written)  # the table's name is written
    for role in ROLES:
        pool = engine.writer.render(setting(spec, role), ["header"])
        assert set(pool.files) <= set(engine.split_files) - set(engine.files)


@pytest.mark.parametrize("engine", registry.ENGINES, ids=registry.NAMES)
def test_a_kind_without_a_method_is_refused_in_one_line(engine):
    block = Speculative("blocky", "parallel", 4, ModelRef("blocky", "org/b", "given"), RATES)
    with pytest.raises(SpecsimError) as caught:
        engine.writer.render(setting(block), ["header"])
    text = str(caught.value)
    assert "'blocky' is of kind 'parallel'" in text and f"{engine.display} has no method" in text
    assert "speculation.drafter" in text and "draft_model, ngram, heads" in text
    assert "\n" not in text
    with pytest.raises(SpecsimError, match="has no method"):
        engine.method(block)


def test_an_unknown_engine_name_is_refused_with_the_known_ones():
    with pytest.raises(SpecsimError, match="'tensorrt' is not an engine specsim writes") as caught:
        registry.engine("tensorrt")
    assert "vllm,sglang,trtllm" in str(caught.value)
    assert emit.parse_engines("trtllm, vllm") == ("vllm", "trtllm")  # the registry's order


def test_the_planner_finds_writers_through_the_registry(monkeypatch):
    class Refusing:
        def refuses(self, setting):
            return "a stand-in writer refuses"

        def render(self, setting, header):
            raise AssertionError("not reached")

    stand_in = dataclasses.replace(registry.TRTLLM, writer=Refusing())
    monkeypatch.setitem(registry._BY_NAME, "trtllm", stand_in)
    spec = DRAFTERS["draft_model"]
    assert emit.refusal("trtllm", setting(spec)) == "a stand-in writer refuses"
    assert emit.refusal("vllm", setting(spec)) is None


def test_a_new_engine_with_a_reader_is_one_entry(monkeypatch):
    """detect tells a result file by the registry's readers: an added entry's format is read."""
    seen = []

    def read_runs(objects, source, sha256):
        seen.append(objects)
        return ["a run"]

    reader = registry.Reader("toy JSON", "a toy result (toy)", lambda d: "toy" in d, read_runs)
    toy = dataclasses.replace(registry.TRTLLM, name="toy", display="Toy", reader=reader)
    monkeypatch.setattr(registry, "ENGINES", (*registry.ENGINES, toy))
    assert len(detect.read_bench_text('{"toy": 1}', "toy.json", "0" * 64)) == 1
    assert seen == [[{"toy": 1}]]
    with pytest.raises(SpecsimError, match="nor a toy result"):
        detect.read_bench_text('{"other": 1}', "x.json", "0" * 64)


def test_no_module_outside_serving_branches_on_an_engine_name():
    """Comparisons with an engine's name (==, !=, in) and imports of an engine's writer are the
    registry's business: elsewhere an engine is found by name through it."""
    found = []
    for path in sorted(SPECSIM.rglob("*.py")):
        if path.relative_to(SPECSIM).parts[0] == "serving":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                if any(isinstance(o, ast.Constant) and o.value in registry.NAMES for o in operands):
                    found.append(f"{path.name}:{node.lineno}")
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
                if any(n.endswith("_config") and ".serving." in n for n in names):
                    found.append(f"{path.name}:{node.lineno} imports a writer")
    assert found == []


BLOCKS = {
    m: Speculative(m, "block", 3, ModelRef(m, f"org/{m}", "given"), RATES, method=m)
    for m in ("dflash", "dspark", "p_eagle", "pard")
}


@pytest.mark.parametrize("method", list(BLOCKS))
@pytest.mark.parametrize("engine", registry.ENGINES, ids=registry.NAMES)
def test_parallel_drafters_are_written_with_one_draft_pass_or_refused(engine, method):
    spec = BLOCKS[method]
    assert spec.deployed_kind == method
    if method not in BLOCK_METHODS[engine.name]:
        assert "has no speculative method for a " + method in engine.writer.refuses(setting(spec))
        return
    assert engine.writer.refuses(setting(spec)) is None
    rendered = engine.writer.render(setting(spec), ["header"])
    assert f"'{engine.method(spec)}'" in str(rendered.written)
    if engine.name == "vllm":
        config = vllm_config.speculative_config(setting(spec))
        assert config["model"] == f"org/{method}" and config["num_speculative_tokens"] == 3
        assert config.get("parallel_drafting", False) == (method in ("p_eagle", "pard"))
    elif engine.name == "sglang":
        options = dict(sglang_config.arguments(setting(spec), 3))
        # One draft pass per step; the last token and 3 drafts verified.
        assert options["--speculative-num-steps"] == "1"
        assert options["--speculative-eagle-topk"] == "1"
        assert options["--speculative-num-draft-tokens"] == "4"
    else:
        config = trtllm_config.options(setting(spec))[0]["speculative_config"]
        assert config["max_draft_len"] == 3 and config["speculative_model"] == f"org/{method}"
