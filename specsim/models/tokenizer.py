"""Tokenizers: the built-in byte-level one, and a user's ``tokenizer.json`` via ``tokenizers``.

Both offer ``encode(text) -> list[int]``, ``decode(ids) -> str``, ``bos_id``, ``eos_id`` and
``vocab_size``. A model directory without a tokenizer still loads as a model (latency does not need
text); asking for its tokenizer is what fails, with a one-line error.
"""

from __future__ import annotations

from pathlib import Path

from specsim.errors import SpecsimError

BYTE_VOCAB = 256
BYTE_BOS_ID = 256
BYTE_EOS_ID = 257
BYTE_VOCAB_SIZE = 258


class ByteTokenizer:
    """UTF-8 bytes are ids 0..255; BOS and EOS follow. Lossless for any text."""

    vocab_size = BYTE_VOCAB_SIZE

    def __init__(self, bos_id: int = BYTE_BOS_ID, eos_id: int = BYTE_EOS_ID):
        self.bos_id = bos_id
        self.eos_id = eos_id

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_id, *ids] if add_bos else ids

    def decode(self, ids) -> str:
        """Text of the byte ids; special ids are dropped, a cut multi-byte character becomes
        U+FFFD (generation can stop in the middle of one)."""
        data = bytes(int(i) for i in ids if 0 <= int(i) < BYTE_VOCAB)
        return data.decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return "ByteTokenizer()"


class HFTokenizer:
    """A ``tokenizer.json`` (Hugging Face ``tokenizers`` format) with ids from config.json."""

    def __init__(self, path: Path, bos_id: int | None, eos_id: int | None):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise SpecsimError(
                "reading tokenizer.json needs the 'tokenizers' package",
                file=str(path),
                fix="pip install tokenizers",
            ) from None
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # the library raises a bare Exception on malformed files
            first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise SpecsimError(
                f"cannot read tokenizer: {first_line}",
                file=str(path),
                fix="copy tokenizer.json again from the model repository",
            ) from None
        self.path = path
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return [self.bos_id, *ids] if add_bos and self.bos_id is not None else ids

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def __repr__(self) -> str:
        return f"HFTokenizer({str(self.path)!r})"
