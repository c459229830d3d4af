"""The running batch's rows of a ``Replica``: a request starting to decode in a free slot,
finishing or being preempted out of it, with its counts banked onto the request, and what
the rows hold of the KV cache."""

from __future__ import annotations

import numpy as np

from specsim.simulation.admission import Chunks
from specsim.simulation.plans import SlotViews
from specsim.simulation.request import Request


class BatchRows:
    """``Replica``'s slot bookkeeping, over the batch arrays ``_init_batch`` makes."""

    def _init_batch(self, cap: int) -> None:
        """The batch arrays for ``cap`` slots, every one free."""
        # Batch arrays (float64 throughout, so dot products need no conversions).
        self.context = np.zeros(cap)  # tokens in the KV cache per decoding row
        self.remaining = np.zeros(cap)  # tokens still to emit; 0 marks an empty slot
        self.output = np.zeros(cap)
        self.level = np.zeros(cap, dtype=np.int64)
        self.row_drafted = np.zeros(cap)
        self.admit_order = np.full(cap, -1, dtype=np.int64)
        self.join_step = [0] * cap
        self.join_remaining = [0] * cap
        self.slot_request: list[Request | None] = [None] * cap
        self.free_slots = list(range(cap - 1, -1, -1))
        self.decoding = 0
        self.decode_kv = 0.0  # sum of context over decoding rows, kept exactly (integers)
        self.capacity = cap
        self.level_shift = np.zeros(cap)  # 2 x level, for the flat acceptance search
        # Occupied slots all lie below ``high``; the per-row arithmetic runs on views of that
        # prefix. At low load a 256-slot engine holds a handful of rows, and numpy's cost per
        # call grows with the array, so this keeps small batches cheap. Empty slots inside the
        # prefix stay harmless as before (remaining 0, context 0: drafts -1, emitted 0).
        self.high = 0
        self._prefix_views: dict[int, SlotViews] = {}
        self._joined = 0  # rows that started decoding since the last decode iteration

    def _held(self) -> float:
        """What the decoding rows hold of the cache: tokens, or blocks with a block size."""
        return self.decode_kv if self.block_size is None else self.decode_blocks()

    def decode_blocks(self) -> float:
        """Blocks the decoding rows hold: cdiv(context + lookahead, block_size) each."""
        views = self._prefix(self.high)
        held = -(-(views.context + self.kv_lookahead) // self.block_size)
        return float(held[views.remaining > 0].sum())

    def evict_youngest(self) -> Request:
        """Take the most recently admitted decoding row out of the batch (preemption: its KV is
        dropped, and it will recompute its prompt and the tokens it generated)."""
        slot = int(np.argmax(self.admit_order))
        request = self.slot_request[slot]
        self._bank_row(slot, request)
        request.generated = request.output - int(self.remaining[slot])
        self._free_slot(slot)
        request.prefill_target = request.prompt + request.generated
        return request

    def _finish_prefills(self, chunks: Chunks, now: float) -> None:
        """Count the chunks as run; a request whose prompt is through starts decoding (or
        finishes, when the prefill's token was its last)."""
        for request in self.admission.complete(chunks, now):
            if request.generated >= request.output:
                self._finish(request, now)
                continue
            self._start_decoding(request)

    def _start_decoding(self, request: Request) -> None:
        """Give a request whose prompt's KV cache is in place a slot in the decoding batch."""
        slot = self.free_slots.pop()
        if slot >= self.high:
            self.high = slot + 1
        left = request.output - request.generated
        self.slot_request[slot] = request
        self.context[slot] = request.prefill_target
        self.decode_kv += request.prefill_target
        self.remaining[slot] = left
        self.output[slot] = request.output
        self.level[slot] = request.level
        self.level_shift[slot] = 2.0 * request.level
        self.row_drafted[slot] = 0.0
        self.admit_order[slot] = request.admit_order
        self.join_step[slot] = self.decode_steps
        self.join_remaining[slot] = left
        self.decoding += 1
        self._joined += 1

    def _bank_row(self, slot: int, request: Request) -> None:
        """Add a row's step counts to its request (before the slot is freed)."""
        steps = self.decode_steps - self.join_step[slot]
        emitted = self.join_remaining[slot] - int(self.remaining[slot])
        request.steps += steps
        request.drafted += int(self.row_drafted[slot])
        request.accepted += emitted - steps  # each step emits its accepted drafts + 1

    def _free_slot(self, slot: int) -> None:
        self.decode_kv -= float(self.context[slot])
        self.remaining[slot] = 0.0
        self.context[slot] = 0.0
        self.level[slot] = 0
        self.level_shift[slot] = 0.0
        self.admit_order[slot] = -1
        self.slot_request[slot] = None
        self.free_slots.append(slot)
        self.decoding -= 1
        high = self.high
        while high and self.slot_request[high - 1] is None:
            high -= 1
        self.high = high

    def _prefix(self, high: int) -> SlotViews:
        """Views of the batch arrays' first ``high`` slots, made once per prefix length."""
        views = self._prefix_views.get(high)
        if views is None:
            views = SlotViews(
                self.remaining[:high],
                self.context[:high],
                self.level_shift[:high],
                self.row_drafted[:high],
                np.ones(high),
            )
            self._prefix_views[high] = views
        return views

    def _finish(self, request: Request, now: float) -> None:
        self.outstanding -= 1
        self.admission.finished(request)
        self.sink.add(
            (
                request.rid,
                request.arrival,
                request.scheduled,
                request.first_token,
                now,
                request.prompt,
                request.output,
                request.steps,
                request.drafted,
                request.accepted,
                request.preemptions,
                self.index,
                self.pool_index,
            )
        )
        self.on_finish(request, now)
