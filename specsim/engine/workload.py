"""The engine's traffic: the simulator's workload, drawn from the same seed, plus real prompts.

Arrival times and lengths come from ``specsim.workload`` with the simulator's random streams
(the scenario seed spawns arrivals, lengths, acceptance and routing streams in that order), so
the engine and the simulator serve the same requests. Prompt token ids come from a prompt set
(the built-in one by default), cycled: request i starts at prompt i mod P, continues with the
following prompts when one is too short, and is cut to the requested length (BOS first).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specsim.errors import SpecsimError
from specsim.scenario import Scenario
from specsim.workload import build_source


@dataclass
class EngineRequest:
    """One request's inputs and what happened to it."""

    rid: int
    arrival: float
    prompt_len: int
    output_len: int
    client: int = -1
    prompt_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)  # the tokens it was given, in order
    scheduled: float = -1.0
    first_token: float = -1.0
    finish: float = -1.0
    generated: int = 0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    logprob_sum: float = 0.0
    eos: bool = False
    last_emit: float = -1.0


class PromptBank:
    """Token ids of a prompt set, cycled and cut to any length."""

    def __init__(self, texts: list[str], tokenizer, source: str = "prompts"):
        self.ids = [tokenizer.encode(t) for t in texts]
        self.ids = [ids for ids in self.ids if ids]
        if not self.ids:
            raise SpecsimError("the prompt set holds no text", file=source, fix="give prompts")
        self.bos = tokenizer.bos_id

    @classmethod
    def from_file(cls, path: str | Path | None, tokenizer) -> PromptBank:
        from specsim.workload.prompts import read_prompts

        if path is None:
            from specsim.models import BUILTIN_PROMPTS

            path = BUILTIN_PROMPTS
        return cls(read_prompts(path), tokenizer, str(path))

    def prompt(self, index: int, length: int) -> list[int]:
        out = [] if self.bos is None else [self.bos]
        i = index
        while len(out) < length:
            out.extend(self.ids[i % len(self.ids)])
            i += 1
        return out[:length]


def scenario_streams(scenario: Scenario) -> tuple[np.random.Generator, np.random.Generator]:
    """The arrivals and lengths generators, exactly as ``run_simulation`` spawns them."""
    streams = np.random.SeedSequence(scenario.seed).spawn(4)
    return np.random.default_rng(streams[0]), np.random.default_rng(streams[1])


def build_engine_source(scenario: Scenario):
    arrivals_rng, lengths_rng = scenario_streams(scenario)
    return build_source(scenario, arrivals_rng, lengths_rng)


def open_loop_requests(source) -> list[EngineRequest]:
    """Every request of an open-loop source or trace, in arrival order."""
    out = []
    for times, prompts, outputs in source.chunks():
        for t, p, o in zip(times.tolist(), prompts.tolist(), outputs.tolist(), strict=True):
            out.append(EngineRequest(len(out), float(t), int(p), int(o)))
    return out
