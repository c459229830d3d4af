"""The request-trace layouts: one registry, from which the scenario's ``format`` values, the
reader (``specsim.workload.traces``) and the docs take them.

A layout names the three columns the simulator reads (arrival time, prompt tokens, output
tokens; any others are ignored) and how its time column is spelled, a key of the reader's
``TIME_PARSERS``. Adding a layout is one entry here (plus a parser there for a new spelling of
time); ``tests/test_trace_formats.py`` reads a file in every layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# How a time column may be spelled, in words; the reader has a parser for each.
TIME_SPELLINGS: dict[str, str] = {
    "seconds": "seconds",
    "datetime": "YYYY-MM-DD HH:MM:SS[.fraction]",
}


@dataclass(frozen=True)
class TraceLayout:
    name: str
    description: str
    time: str  # the arrival-time column
    prompt: str  # the prompt-tokens column
    output: str  # the output-tokens column
    time_parser: str  # how the time column is spelled: a key of TIME_SPELLINGS

    @property
    def columns(self) -> tuple[str, str, str]:
        return (self.time, self.prompt, self.output)

    def describe(self) -> str:
        """The layout in one phrase, for the docs."""
        time = TIME_SPELLINGS[self.time_parser]
        return f"{self.description}: columns {self.time} ({time}), {self.prompt}, {self.output}"


TRACE_FORMATS: dict[str, TraceLayout] = {
    layout.name: layout
    for layout in (
        TraceLayout(
            "azure",
            "Azure LLM inference",
            "TIMESTAMP",
            "ContextTokens",
            "GeneratedTokens",
            time_parser="datetime",
        ),
        TraceLayout(
            "vidur",
            "Vidur",
            "arrived_at",
            "num_prefill_tokens",
            "num_decode_tokens",
            time_parser="seconds",
        ),
        TraceLayout(
            "burstgpt",
            "BurstGPT",
            "Timestamp",
            "Request tokens",
            "Response tokens",
            time_parser="seconds",
        ),
    )
}

AUTO = "auto"  # detect the layout from the header
TraceFormatName = Literal[(AUTO, *TRACE_FORMATS)]  # type: ignore[valid-type]  # schema fields


def trace_format_descriptions() -> str:
    """Every layout with its columns, for a schema field's description."""
    return "; ".join(f"'{f.name}': {f.describe()}" for f in TRACE_FORMATS.values())
