"""A replica's acceptance stream for the compiled path: PCG64 stepped and jumped in numba.

The same numbers, in the same order, as ``UniformStream`` and so as ``Generator.random``: the
state is numpy's PCG64 (a 128-bit LCG), kept as four uint64 words and advanced by the compiled
kernels exactly as numpy's C code advances it. What it adds: a stretch takes only the doubles
of its occupied slots (``slot_uniforms``) and jumps over the others' (the reference draws one
per batch slot, hundreds, per iteration), and a rewind or a skip is one jump-ahead rather than
doubles drawn and dropped. Any other draw (``integers``: the acceptance levels) hands the state
back to the generator first and takes it back after.
"""

from __future__ import annotations

import numpy as np

from specsim.simulation.compiled import kernels

_MASK64 = (1 << 64) - 1


class JumpStream:
    """``random()`` doubles of a PCG64 Generator, from its state in numba."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self._bits = rng.bit_generator
        self._kernels = kernels()
        self._read()
        self.position = 0  # doubles handed out (or jumped over) since the stream was made

    @staticmethod
    def fits(rng) -> bool:
        """Whether ``rng`` is a Generator on numpy's PCG64 (what the kernels step)."""
        state = getattr(getattr(rng, "bit_generator", None), "state", None)
        return isinstance(state, dict) and state.get("bit_generator") == "PCG64"

    def take(self, n: int) -> np.ndarray:
        """The next ``n`` doubles."""
        self._catch_up()
        out = np.empty(n)
        self._kernels.pcg_random(self._words, out)
        self.position += n
        self._at = self.position
        return out

    def random(self, size) -> np.ndarray:
        """``Generator.random(size)`` for an int or a shape."""
        if isinstance(size, tuple):
            return self.take(int(np.prod(size))).reshape(size)
        return self.take(int(size))

    def words_for(self, m: int, blocks: int, capacity: int) -> np.ndarray:
        """The state here, for a kernel to draw from (a copy), and the stream moved past the
        next ``m * blocks * capacity`` doubles (``m`` iterations drawing ``blocks`` blocks of
        one per slot); ``rewind`` hands back what is not used."""
        self._catch_up()
        words = self._words.copy()
        self.position += m * blocks * capacity
        return words

    def slot_uniforms(self, m: int, blocks: int, capacity: int, used: int) -> np.ndarray:
        """Of the next ``m * blocks * capacity`` doubles, those of the first ``used`` slots of
        each block: ``(m, blocks * used)`` flat."""
        words = self.words_for(m, blocks, capacity)
        return self._kernels.pcg_slot_uniforms(words, m, blocks, capacity, used)

    def rewind(self, position: int) -> None:
        """Hand back the doubles taken after stream position ``position``."""
        if not self._at <= position <= self.position:
            raise ValueError(f"cannot rewind to {position}: the state is at {self._at}")
        self.position = position

    def integers(self, *args, **kwargs):
        """``Generator.integers``, drawn where the doubles handed out so far end."""
        self._catch_up()
        state = self._bits.state
        high, low = int(self._words[0]), int(self._words[1])
        state["state"]["state"] = (high << 64) | low
        self._bits.state = state
        values = self.rng.integers(*args, **kwargs)
        self._read()
        return values

    def _catch_up(self) -> None:
        """Advance the state from where it was last known to the stream's position."""
        if self._at != self.position:
            self._kernels.pcg_advance(self._words, self.position - self._at)
            self._at = self.position

    def _read(self) -> None:
        """Take the generator's state (the buffered 32-bit half-draw stays in the generator:
        ``random()`` neither uses nor changes it)."""
        state = self._bits.state["state"]
        value, inc = state["state"], state["inc"]
        self._words = np.array(
            [value >> 64, value & _MASK64, inc >> 64, inc & _MASK64], dtype=np.uint64
        )
        self._at = getattr(self, "position", 0)
