"""Which engine caps a calibration or a bench validation replays the runs with, and from where.

Each cap (``engine.max_batch``, ``engine.max_batched_tokens``) is, first found: the one given
(``--max-batch``, or a scenario that sets it), the one the server's log or flags file states
(``--server-args FILE``: ``specsim.serving.caps.read_server_args``), or the runs' engine's
own default for the device (the profile's hardware; ``specsim.serving.caps``). Only where the
runs' engine has no known defaults (a normalised table's ``other``) is it specsim's scenario
default, and the source then says so. SGLang's ``server_info`` still gives each of its runs
its ``max_running_requests`` (``workload.engine_settings``).

The engine's prefill schedule comes the same way: SGLang runs prefill batches apart from decode
batches unless ``--enable-mixed-chunk`` is on (``prefill_schedule``), replayed as
``engine.chunked_prefill: false``; vLLM and TensorRT-LLM mix prompt chunks into decode batches.
"""

from __future__ import annotations

import re
from pathlib import Path

from specsim.calibration.workload import EngineDefaults
from specsim.errors import SpecsimError
from specsim.fileio import check_input_file
from specsim.profile import Profile
from specsim.scenario import Engine
from specsim.serving import registry
from specsim.serving.caps import CAPS, Device, read_server_args, states_flag
from specsim.serving.runs import BenchRun

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*GB\b", re.IGNORECASE)


def device_of(profile: Profile) -> Device:
    """The device the engine defaults depend on: its name, and its memory from the name's "NN
    GB" where it has one (the profile's memory_bytes is what it leaves to weights and cache)."""
    name = profile.hardware.name
    size = _SIZE.search(name)
    return Device(name, float(size.group(1)) * 1e9 if size else profile.hardware.memory_bytes)


def _rules(engine: str):
    if engine in registry.NAMES and registry.engine(engine).caps is not None:
        return [registry.engine(engine).caps]
    return [e.caps for e in registry.ENGINES if e.caps is not None]


def _from_file(path: str, text: str, engine: str) -> tuple[dict[str, int], dict[str, str]]:
    values, sources = {}, {}
    for rule in _rules(engine):
        for cap, value in read_server_args(text, rule).items():
            if cap not in values:
                values[cap] = value
                sources[cap] = f"{Path(path).name} ({rule.keys[CAPS.index(cap)]})"
    if not values:
        keys = ", ".join(k for rule in _rules(engine) for k in rule.keys)
        raise SpecsimError(
            "states none of the engine's batch caps",
            file=path,
            key="--server-args",
            fix=f"give the server's log or flags with {keys}, or drop --server-args",
        )
    return values, sources


def resolve_caps(
    runs: list[BenchRun],
    given: dict[str, tuple[int, str]],
    server_args: str | None,
    profile: Profile,
) -> EngineDefaults:
    """The caps for ``runs`` and where each came from (module docstring); ``given`` maps a
    cap to its value and where it was given."""
    engine = runs[0].engine
    values, sources, text = {}, {}, None
    if server_args is not None:
        text = check_input_file(server_args, "server log or flags file").read_text(
            "utf-8", "replace"
        )
        values, sources = _from_file(server_args, text, engine)
    rules = _rules(engine) if engine in registry.NAMES else []
    default = None
    if rules:
        speculating = any(run.speculation is not None for run in runs)
        default = rules[0].defaults(device_of(profile), speculating)
    scenario = Engine()
    out, words = [], []
    for i, cap in enumerate(CAPS):
        if cap in given:
            value, source = given[cap]
        elif cap in values:
            value, source = values[cap], sources[cap]
        elif default is not None:
            value, source = default[i], default[2]
        else:
            value = getattr(scenario, cap)
            source = f"specsim's default: the runs' engine ({engine}) has no known defaults"
        out.append(value)
        words.append(source)
    apart, why = prefill_schedule(engine, server_args, text)
    return EngineDefaults(out[0], out[1], tuple(words), apart, why)


def prefill_schedule(engine: str, server_args: str | None, text: str | None) -> tuple[bool, str]:
    """Whether the runs' engine ran prefill batches apart from decode batches (SGLang's
    default), and why, in words: its mixing flag on in the ``server_args`` file (its ``text``)
    mixes them."""
    spec = registry.engine(engine) if engine in registry.NAMES else None
    if spec is None or spec.mixing_flag is None:
        return False, EngineDefaults.prefill_source
    flag = spec.mixing_flag
    if text is not None and states_flag(text, flag):
        return False, f"{Path(server_args).name} ({flag} on: prompt chunks ride in decode batches)"
    return (
        True,
        f"{spec.display}'s default: prefill batches run apart from decode batches ({flag} off)",
    )
