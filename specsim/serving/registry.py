"""The serving engines specsim writes configurations for and reads results of: one entry each.

An ``Engine`` holds everything specsim knows of one engine by name: the version whose documented
keys its writer and readers follow (engine-formats.md), its configuration writer and the files
that writer may emit, its method name per specsim drafter kind, its split fleet's router, its
own load-test client, its benchmark-file reader and its /metrics reader where it has them, and
its documented defaults. Code outside ``serving`` finds an engine's parts here by name and
branches on no engine's name; a new engine, method table row or per-engine behaviour is an
entry field, not a branch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from specsim.errors import SpecsimError
from specsim.serving import (
    bench_commands,
    caps,
    prometheus,
    sglang,
    sglang_config,
    trtllm_config,
    vllm,
    vllm_config,
)
from specsim.serving.bench_commands import BenchClient
from specsim.serving.caps import CapRule
from specsim.serving.runs import BenchRun
from specsim.serving.setting import ROLES, EngineSetting, Rendered, Speculative, engine_method
from specsim.serving.setting import role_file as _role_file


class Writer(Protocol):
    """An engine's configuration writer (a ``serving.*_config`` module)."""

    def refuses(self, setting: EngineSetting) -> str | None: ...

    def render(self, setting: EngineSetting, header: list[str]) -> Rendered: ...


@dataclass(frozen=True)
class Reader:
    """A benchmark tool's result objects: told apart by their keys, read into ``BenchRun``s."""

    title: str  # the file format, as errors list the known ones
    described: str  # ``a vLLM result (model_id, duration)``: what tells it apart
    detects: Callable[[Any], bool]
    read_runs: Callable[[list[dict], str, str], list[BenchRun]]


@dataclass(frozen=True, eq=False)  # one entry per engine: compared and hashed by identity
class Engine:
    name: str  # as --emit, summary.json and a run's ``engine`` spell it
    display: str
    version: str  # the version whose documented keys the writer and readers follow
    writer: Writer
    files: tuple[str, ...]  # every file the writer may emit for a co-located replica
    methods: Mapping[str, str]  # specsim's drafter kind (``Speculative.deployed_kind``) -> name
    router: str  # how a split fleet's requests reach its prefill and decode servers
    # The router's own file for a split layout: (label, prefill, decode) -> (text, config).
    router_file: tuple[str, Callable[[str, int, int], tuple[str, dict]]] | None = None
    bench: BenchClient | None = None
    reader: Reader | None = None
    scrape: Callable[..., prometheus.Scrape | None] | None = None
    # Documented defaults of the engine at ``version`` (engine-formats.md), by its own keys,
    # other than its batch caps (``caps``, which depend on the device).
    defaults: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    caps: CapRule | None = None  # its batch caps' keys and defaults per device
    # Where the engine runs prefill batches apart from decode batches by default: the flag that
    # mixes them (SGLang's ``enable_mixed_chunk``, off by default, §4.9). None: prompt chunks
    # ride in the decode iterations under the token budget (vLLM, TensorRT-LLM).
    mixing_flag: str | None = None
    # The work the engine's own loop does on each request it admits, where it is known to
    # pay some (vLLM): calibration fits ``overhead.per_request_engine_s`` for its runs even
    # where the prior states none. None: kept as the prior states it.
    request_work: str | None = None

    def method(self, spec: Speculative) -> str:
        """The engine's method for the drafter; a kind it has no method for is refused."""
        return engine_method(self.methods, spec, self.display)

    @property
    def split_files(self) -> tuple[str, ...]:
        """Every file the writer may emit for a split fleet's pools (and their router)."""
        pools = tuple(_role_file(name, role) for name in self.files for role in ROLES)
        return pools if self.router_file is None else (*pools, self.router_file[0])


VLLM = Engine(
    name="vllm",
    display="vLLM",
    version="0.33",
    writer=vllm_config,
    files=(vllm_config.SPEC_FILE, vllm_config.ARGS_FILE),
    methods=MappingProxyType(vllm_config.KIND_METHODS),
    router=vllm_config.ROUTER,
    bench=bench_commands.VLLM,
    reader=Reader(
        "vllm bench serve --save-result JSON",
        "a vLLM result (model_id, duration)",
        vllm.is_vllm_result,
        vllm.read_runs,
    ),
    scrape=prometheus.vllm_scrape,
    caps=caps.VLLM,
    request_work="the engine core's add_request, the scheduler's allocate_slots and "
    "NewRequestData, the model runner's InputBatch.add_request",
)
SGLANG = Engine(
    name="sglang",
    display="SGLang",
    version="0.5.23",
    writer=sglang_config,
    files=(sglang_config.ARGS_FILE, sglang_config.ADAPTIVE_FILE),
    methods=MappingProxyType(sglang_config.KIND_METHODS),
    router=sglang_config.ROUTER,
    bench=bench_commands.SGLANG,
    reader=Reader(
        "SGLang bench_serving JSONL",
        "an SGLang result (mean_e2e_latency_ms)",
        sglang.is_sglang_result,
        sglang.read_runs,
    ),
    scrape=prometheus.sglang_scrape,
    # tp_size (§4.5); page_size (§4.8). Its batch caps: ``caps``.
    defaults=MappingProxyType({"page_size": 1, "tp_size": 1}),
    caps=caps.SGLANG,
    mixing_flag="enable_mixed_chunk",
    # No ``request_work``: fitted from 0 on its bundled runs, the term took the fit into another
    # basin (docs/notes/2026-12-03-engine-request-cost.md).
)
TRTLLM = Engine(
    name="trtllm",
    display="TensorRT-LLM",
    version="llm_args.py @ 0004396",
    writer=trtllm_config,
    files=(trtllm_config.YAML_FILE,),
    methods=MappingProxyType(trtllm_config.KIND_METHODS),
    router=trtllm_config.ROUTER,
    router_file=(trtllm_config.DISAGG_FILE, trtllm_config.router_file),
    caps=caps.TRTLLM,
    # No ``request_work``: fitted from 0, its bundled runs left the term undetermined (the same
    # note), and nothing measured here says what its executor pays per request.
)

ENGINES = (VLLM, SGLANG, TRTLLM)
NAMES = tuple(engine.name for engine in ENGINES)
_BY_NAME = {engine.name: engine for engine in ENGINES}


def engine(name: str, option: str = "--emit") -> Engine:
    """The entry of the engine named; an unknown name is refused."""
    if name not in _BY_NAME:
        raise SpecsimError(
            f"{name!r} is not an engine specsim writes",
            key=option,
            fix=f"give a comma-separated subset of {','.join(NAMES)}",
        )
    return _BY_NAME[name]


def entries(names: Iterable[str]) -> tuple[Engine, ...]:
    """The engines named, in the registry's order."""
    wanted = set(names)
    return tuple(e for e in ENGINES if e.name in wanted)


def readers() -> tuple[Engine, ...]:
    """The engines whose benchmark result files specsim reads, in the order they are tried."""
    return tuple(e for e in ENGINES if e.reader is not None)


def bench_clients(served: Iterable[str]) -> tuple[str, ...]:
    """The load-test clients for the servers of ``served``: each served engine's own, and those
    that test any engine's server."""
    served = set(served)
    return tuple(
        e.name for e in ENGINES if e.bench is not None and (e.bench.any_server or e.name in served)
    )
