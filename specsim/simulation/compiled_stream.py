"""A replica's acceptance stream for the compiled path: PCG64 stepped and jumped in numba.

The same numbers, in the same order, as ``UniformStream`` and so as ``Generator.random``: the
state is numpy's PCG64 (a 128-bit LCG), kept as four uint64 words and advanced by the compiled
kernels exactly as numpy's C code advances it. What it adds: a kernel jumps over the draws of
empty batch slots (the reference draws one per slot, hundreds, per iteration), and a skip is
one jump-ahead rather than doubles drawn and dropped. Any other draw (``integers``: the
acceptance levels) hands the state back to the generator first and takes it back after.
"""

from __future__ import annotations

import numpy as np

from specsim.simulation.compiled import kernels

_MASK64 = (1 << 64) - 1


READ_AHEAD = 1 << 16  # most doubles drawn ahead for single takes


class JumpStream:
    """``random()`` doubles of a PCG64 Generator, from its state in numba.

    Single takes (an iteration's one uniform per slot) come from a block drawn ahead, which
    doubles while takes follow on from each other (a busy replica) and is one take long after
    a jump (at low load, where a kernel call follows each iteration and would skip the rest)."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self._bits = rng.bit_generator
        self._kernels = kernels()
        self.position = 0  # doubles handed out (or jumped over) since the stream was made
        self._read()

    @staticmethod
    def fits(rng) -> bool:
        """Whether ``rng`` is a Generator on numpy's PCG64 (what the kernels step)."""
        state = getattr(getattr(rng, "bit_generator", None), "state", None)
        return isinstance(state, dict) and state.get("bit_generator") == "PCG64"

    def take(self, n: int) -> np.ndarray:
        """The next ``n`` doubles (a view: read it before the next ``take``)."""
        offset = self.position - self._base
        buffered = self._buffer.shape[0]
        if offset + n > buffered:
            size = min(2 * buffered, READ_AHEAD) if offset == buffered else 0
            self._base_words = self._state_at(self.position)
            self._base, offset = self.position, 0
            self._buffer = np.empty(max(size, n))
            self._kernels.pcg_random(self._base_words.copy(), self._buffer)
        self.position += n
        return self._buffer[offset : offset + n]

    def random(self, size) -> np.ndarray:
        """``Generator.random(size)`` for an int or a shape."""
        if isinstance(size, tuple):
            return self.take(int(np.prod(size))).reshape(size)
        return self.take(int(size))

    def base(self) -> tuple[np.ndarray, int]:
        """A known state and how many doubles the stream stands past it (for a kernel that
        jumps ahead itself and draws from a copy; ``skip`` then moves the stream on)."""
        return self._base_words, self.position - self._base

    def skip(self, n: int) -> None:
        """Move on past ``n`` doubles drawn elsewhere from the state at ``position``."""
        self.position += n

    def integers(self, *args, **kwargs):
        """``Generator.integers``, drawn where the doubles handed out so far end."""
        words = self._state_at(self.position)
        state = self._bits.state
        state["state"]["state"] = (int(words[0]) << 64) | int(words[1])
        self._bits.state = state
        values = self.rng.integers(*args, **kwargs)
        self._read()
        return values

    def _state_at(self, position: int) -> np.ndarray:
        """The state after ``position`` doubles (a new array): the known one, jumped ahead."""
        words = self._base_words.copy()
        if position > self._base:
            self._kernels.pcg_advance(words, position - self._base)
        return words

    def _read(self) -> None:
        """Take the generator's state (the buffered 32-bit half-draw stays in the generator:
        ``random()`` neither uses nor changes it)."""
        state = self._bits.state["state"]
        value, inc = state["state"], state["inc"]
        self._base_words = np.array(
            [value >> 64, value & _MASK64, inc >> 64, inc & _MASK64], dtype=np.uint64
        )
        self._base = self.position
        self._buffer = np.empty(0)
