"""Each request's cached prompt prefix (``workload.prefix``), for the replica that admits it.

Requests are numbered in arrival order (the trace's rows sorted by time), and every source here
answers by that number, so a request's prefix never depends on when or where it is served, with
one exception that is the point of it: a session's earlier turn is a hit only on the replica
that served it.

- 'column': the trace's column of cached tokens, taken as given.
- 'fraction' / 'system_prompt': one uniform per request from a stream of its own (spawn key 5 of
  the scenario's seed; the simulator's streams 0-4 are unchanged), a hit when below ``hit_rate``.
- 'session': a turn's prompt is taken to start with the previous turn's prompt and output (a chat
  API resends the conversation). That prefix is cached when the previous turn finished on the
  same replica before this one is admitted, and the replica still remembers it: each replica
  remembers the prefixes of finished turns, least recently used first out, in the cache that
  its running sequences leave free, trimmed to that room at each admission (vLLM evicts free
  cached blocks, least recently used first, as running sequences need them; a peak between two
  admissions is not seen).

The hit is then capped by the admission (``specsim.simulation.admission``): the prompt less one
token, and whole blocks with ``engine.block_size``.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import numpy as np

from specsim.bounds import MAX_TOKENS
from specsim.errors import SpecsimError
from specsim.scenario import Scenario
from specsim.workload.traces import Trace
from specsim.workload_settings import PrefixCache

PREFIX_STREAM = 5  # the spawn key of the prefix stream (run.py's streams are 0-4)
DRAW_CHUNK = 4096
DEFAULT_COLUMNS = {"column": ("cached_tokens",), "session": ("SessionID", "session_id")}


def prefix_rng(seed: int) -> np.random.Generator:
    """The prefix stream: ``SeedSequence(seed).spawn(6)[5]``, without spawning the others."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(PREFIX_STREAM,)))


class NoPrefix:
    """No request hits a cache."""

    shared = False  # whether every hit is a prefix of one sequence (its blocks shared)
    # Whether a request's hit is its own alone (its number and lengths), whenever and wherever
    # it is admitted: the serving kernel takes such hits drawn ahead (``cached_many``).
    by_request = True

    def cached(self, request) -> int:
        return 0

    def cached_many(self, rids: np.ndarray, prompts: np.ndarray) -> np.ndarray:
        """``cached`` for requests numbered ``rids`` with these prompts (``by_request`` only)."""
        return np.zeros(rids.shape[0], dtype=np.int64)

    def finished(self, request) -> None:
        pass

    def remembered(self, request) -> int:
        """Tokens of the request's session this replica remembers, for a router (sessions
        only); it leaves their recency alone."""
        return 0

    def trim(self, room: float) -> None:
        """The cache left free for remembered prefixes is ``room`` tokens (sessions only)."""

    def released(self, request) -> None:
        """The request's sequence left the cache unfinished (preempted): what it hit is no
        longer held by it (sessions only)."""


class GivenPrefixes(NoPrefix):
    """Cached tokens per request number, as the trace gives them."""

    def __init__(self, cached: np.ndarray):
        self._cached = cached

    def cached(self, request) -> int:
        return int(self._cached[request.rid])

    def cached_many(self, rids: np.ndarray, prompts: np.ndarray) -> np.ndarray:
        return self._cached[rids]


class DrawnPrefixes(NoPrefix):
    """A share of the prompt or a shared system prompt, cached with probability ``hit_rate``;
    the uniforms are drawn in chunks, by request number."""

    def __init__(self, prefix: PrefixCache, rng: np.random.Generator):
        self.fraction = prefix.fraction
        self.length = prefix.length
        self.hit_rate = prefix.hit_rate
        # A system prompt is one token sequence, held once per replica; a fraction of each
        # prompt is that prompt's own.
        self.shared = self.length is not None
        self.rng = rng
        self._uniforms = np.zeros(0)

    def _draw_to(self, rid: int) -> np.ndarray:
        """The uniforms up to request ``rid``'s (the same values in whatever steps drawn)."""
        while rid >= self._uniforms.shape[0]:
            self._uniforms = np.concatenate([self._uniforms, self.rng.random(DRAW_CHUNK)])
        return self._uniforms

    def cached(self, request) -> int:
        if not self._draw_to(request.rid)[request.rid] < self.hit_rate:
            return 0
        if self.length is not None:
            return self.length
        return int(self.fraction * request.prompt)

    def cached_many(self, rids: np.ndarray, prompts: np.ndarray) -> np.ndarray:
        if not rids.shape[0]:
            return np.zeros(0, dtype=np.int64)
        hit = self._draw_to(int(rids.max()))[rids] < self.hit_rate
        if self.length is not None:
            return np.where(hit, self.length, 0)
        return np.where(hit, (self.fraction * prompts).astype(np.int64), 0)


class SessionMemory(NoPrefix):
    """One replica's memory of finished turns: session -> tokens of its last finished turn
    (prompt and output; the prompt alone on a disaggregated prefill replica, which never holds
    the output's KV), least recently used first out, within ``capacity`` tokens.

    As vLLM's free block queue, the memory (``held``) is the cached blocks no running sequence
    references: a turn that hits takes its session's entry out of it (the running sequence's
    own KV counts it from then on; a later turn of the session arriving meanwhile still hits
    it); the entry comes back, most recent, when that sequence is preempted, and is replaced by
    the longer turn when it finishes."""

    by_request = False  # a hit depends on what the replica served before

    def __init__(self, sessions: np.ndarray, capacity: int, remembers_output: bool = True):
        self.sessions = sessions  # session code per request number; -1: none
        self.capacity = capacity
        self.remembers_output = remembers_output
        self.held = 0
        self._turns: OrderedDict[int, int] = OrderedDict()  # unreferenced, oldest first
        # Entries running sequences hit: session -> {tokens: the requests holding them}.
        self._in_use: dict[int, dict[int, set[int]]] = {}
        self._holding: dict[int, tuple[int, int]] = {}  # request number -> (session, tokens)

    def trim(self, room: float) -> None:
        while self.held > room and self._turns:
            _, dropped = self._turns.popitem(last=False)
            self.held -= dropped

    def remembered(self, request) -> int:
        session = int(self.sessions[request.rid])
        return max(self._turns.get(session, 0), max(self._in_use.get(session, {0: None})))

    def cached(self, request) -> int:
        session = int(self.sessions[request.rid])
        tokens = self._turns.pop(session, 0)
        if tokens:
            self.held -= tokens
        elif session in self._in_use:  # held by a running turn of the session: hit it too
            tokens = max(self._in_use[session])
        if tokens:
            self._in_use.setdefault(session, {}).setdefault(tokens, set()).add(request.rid)
            self._holding[request.rid] = (session, tokens)
        return tokens

    def released(self, request) -> None:
        held = self._holding.pop(request.rid, None)
        if held is None:
            return
        session, tokens = held
        entries = self._in_use[session]
        entries[tokens].discard(request.rid)
        if entries[tokens]:
            return
        del entries[tokens]
        if not entries:
            del self._in_use[session]
        remembered = self._turns.get(session, 0)
        if tokens > remembered:  # back in the memory, most recent, unless it holds more
            self._turns.pop(session, None)
            self._turns[session] = tokens
            self.held += tokens - remembered

    def finished(self, request) -> None:
        self.released(request)
        session = int(self.sessions[request.rid])
        if session < 0:
            return
        tokens = request.prompt + (request.output if self.remembers_output else 0)
        self.held += tokens - self._turns.pop(session, 0)
        self._turns[session] = tokens
        self.trim(self.capacity)


class Prefixes:
    """The scenario's prefix source; ``for_replica`` gives each replica what it asks."""

    def __init__(self, prefix: PrefixCache | None, data, rng: np.random.Generator | None):
        self.prefix = prefix
        self._data = data  # cached tokens or session codes per request number
        self._drawn = DrawnPrefixes(prefix, rng) if rng is not None else None

    def for_replica(self, capacity_tokens: int, remembers_output: bool = True):
        """``remembers_output`` False: a session's turn is remembered by its prompt alone."""
        if self.prefix is None:
            return NoPrefix()
        if self._drawn is not None:
            return self._drawn  # by request number: one object serves every replica alike
        if self.prefix.source == "column":
            return GivenPrefixes(self._data)
        return SessionMemory(self._data, capacity_tokens, remembers_output)


def build_prefixes(scenario: Scenario, trace: Trace | None) -> Prefixes:
    """The scenario's prefixes (a trace column is read here, not later)."""
    prefix = scenario.workload.prefix
    if prefix is None:
        return Prefixes(None, None, None)
    if prefix.source in ("fraction", "system_prompt"):
        return Prefixes(prefix, None, prefix_rng(scenario.seed))
    assert trace is not None  # the scenario's validation asks for a trace workload
    column = read_prefix_column(trace, prefix)
    return Prefixes(prefix, column, None)


def _column_name(trace: Trace, prefix: PrefixCache) -> tuple[str, list[str]]:
    import pandas as pd

    header = [h.strip() for h in pd.read_csv(trace.path, nrows=0, dtype=str).columns]
    wanted = (prefix.column,) if prefix.column else DEFAULT_COLUMNS[prefix.source]
    for name in wanted:
        if name in header:
            return name, header
    raise SpecsimError(
        f"trace has no column {' or '.join(repr(n) for n in wanted)} for the {prefix.source!r} "
        "prefix",
        file=str(trace.path),
        key="workload.prefix.column",
        fix=f"name the column in workload.prefix.column (the header has {', '.join(header)})",
    )


def read_prefix_column(trace: Trace, prefix: PrefixCache) -> np.ndarray:
    """The prefix column in request order: cached tokens (whole, 0 to MAX_TOKENS) or session
    codes (an empty cell: no session, -1)."""
    import pandas as pd

    name, _ = _column_name(trace, prefix)
    cells = pd.read_csv(
        trace.path,
        usecols=lambda c: c.strip() == name,
        dtype=str,
        keep_default_na=False,
        encoding="utf-8",
    ).iloc[:, 0]
    cells = cells.str.strip().to_numpy(dtype=object)
    if cells.shape[0] != len(trace):
        raise SpecsimError(
            f"column {name!r} has {cells.shape[0]} rows but the trace {len(trace)}",
            file=str(trace.path),
            fix="repair the rows with missing cells",
        )
    rows = trace.file_rows if trace.file_rows is not None else np.arange(len(trace))
    cells = cells[rows]
    if prefix.source == "session":
        codes = pd.factorize(cells)[0].astype(np.int64)
        codes[cells == ""] = -1
        return codes
    return _cached_tokens(cells, rows, name, trace.path)


def _cached_tokens(cells: np.ndarray, rows: np.ndarray, name: str, path: Path) -> np.ndarray:
    import pandas as pd

    values = pd.to_numeric(pd.Series(cells), errors="coerce").to_numpy(dtype=np.float64)
    with np.errstate(invalid="ignore"):
        good = (values >= 0) & (values <= MAX_TOKENS) & (values == np.floor(values))
    if not good.all():
        i = int(np.flatnonzero(~good)[0])
        raise SpecsimError(
            f"line {int(rows[i]) + 2}: {name} {cells[i]!r} is not a whole number of tokens from "
            f"0 to {MAX_TOKENS:,}",
            file=str(path),
            key="workload.prefix.column",
            fix="repair the row or name another column",
        )
    return values.astype(np.int64)
