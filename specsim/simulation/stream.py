"""A replica's acceptance stream, read ahead in blocks.

``UniformStream`` hands out a ``numpy.random.Generator``'s ``random()`` doubles from blocks
drawn ahead: a stretch of m engine iterations takes its m x n uniforms in one slice, and they
are the numbers m calls of ``rng.random(n)`` would have returned (each double consumes one
64-bit draw of the bit generator, so the sequence does not depend on how it is cut). Values
drawn ahead but not used can be handed back (``rewind``), since nothing else reads the
stream meanwhile. Any other draw (``integers``: the acceptance levels) first puts the generator
exactly where the doubles handed out so far would have left it.
"""

from __future__ import annotations

import numpy as np

READ_AHEAD = 1 << 16  # doubles per block drawn ahead (512 KiB): a stretch's block, several times


class UniformStream:
    """``random()`` doubles of a Generator, read ahead; the same numbers in the same order."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self._bits = rng.bit_generator
        self._buffer = np.empty(0)
        self._state = None  # the bit generator's state at the buffer's first value
        self._start = 0  # stream position of the buffer's first value
        self.position = 0  # doubles handed out since the stream was made

    def take(self, n: int) -> np.ndarray:
        """The next ``n`` doubles (a view: read it before the next ``take``)."""
        offset = self.position - self._start
        if offset + n > self._buffer.shape[0]:
            self._sync()
            self._state = self._bits.state
            self._start = self.position
            self._buffer = self.rng.random(max(READ_AHEAD, n))
            offset = 0
        self.position += n
        return self._buffer[offset : offset + n]

    def random(self, size) -> np.ndarray:
        """``Generator.random(size)`` for an int or a shape, from the buffer."""
        if isinstance(size, tuple):
            return self.take(int(np.prod(size))).reshape(size)
        return self.take(int(size))

    def rewind(self, position: int) -> None:
        """Hand back the doubles taken after stream position ``position``."""
        if not self._start <= position <= self.position:
            raise ValueError(f"cannot rewind to {position}: the buffer starts at {self._start}")
        self.position = position

    def integers(self, *args, **kwargs):
        """``Generator.integers``, drawn where the doubles handed out so far end."""
        self._sync()
        self._buffer = np.empty(0)
        self._start = self.position
        return self.rng.integers(*args, **kwargs)

    def _sync(self) -> None:
        """Put the generator where the doubles handed out so far leave it."""
        if self._state is None:
            return  # nothing drawn ahead: the generator is where it should be
        saved, self._state = self._state, None
        self._bits.state = saved
        skip = self.position - self._start
        if not skip:
            return
        if hasattr(self._bits, "advance") and "has_uint32" in saved:
            # PCG64: one 64-bit draw per double. advance() also drops the buffered 32-bit
            # half-draw that random() would have kept, so it is put back.
            self._bits.advance(skip)
            state = self._bits.state
            state["has_uint32"], state["uinteger"] = saved["has_uint32"], saved["uinteger"]
            self._bits.state = state
        else:
            self.rng.random(skip)
