"""The one error type users see: a one-line message naming the file, the key and the fix.

The CLI turns a ``SpecsimError`` into that line on stderr and exit code 2, with no traceback.
Library callers can catch it like any exception.
"""

from __future__ import annotations

EXIT_BAD_INPUT = 2


class SpecsimError(Exception):
    """Bad input: a file, a key, a value or a query that specsim cannot use.

    ``file`` is the path (or a pseudo-source such as ``--set``), ``key`` the dotted key inside it,
    ``fix`` what the user should do. All are optional; the message is always one line.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        key: str | None = None,
        fix: str | None = None,
    ):
        self.message = message
        self.file = None if file is None else str(file)
        self.key = key
        self.fix = fix
        super().__init__(self.one_line())

    def one_line(self) -> str:
        parts = [p for p in (self.file, self.key) if p]
        text = ": ".join([*parts, self.message])
        if self.fix:
            text += f"; fix: {self.fix}"
        return " ".join(text.split())
