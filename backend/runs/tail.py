"""Incremental readers for files that grow while a run writes them.

Each call reads only the bytes appended since the previous call, so a panel polling a
long run every second costs the same at step 100 000 as at step 10. A partial last
line (the writer is mid-line) is kept for the next call. A file that shrinks or is
replaced (a new run in the same place) is read again from its start.
"""

from __future__ import annotations

import os
from pathlib import Path

# The run supervisor reads these files too, as a script without tunedeck: one parser for both,
# so that both skip the same damaged lines.
from tunedeck.backend.runs.supervisor import json_objects


class LineTail:
    """New complete lines (bytes, without their newline) appended to a file."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._offset = 0
        self._partial = b""
        self._inode: int | None = None

    def read_lines(self) -> list[bytes]:
        try:
            with open(self.path, "rb") as f:
                stat = os.fstat(f.fileno())
                if stat.st_ino != self._inode or stat.st_size < self._offset:
                    self._offset, self._partial, self._inode = 0, b"", stat.st_ino
                f.seek(self._offset)
                chunk = f.read()
        except OSError:  # not there (yet), or not a readable file: nothing to show, never an error
            return []
        self._offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()  # b"" when the chunk ended with a newline
        return lines


class JsonlTail(LineTail):
    """New JSON objects appended to a .jsonl file; lines that are not JSON objects are skipped."""

    def read_new(self) -> list[dict]:
        return json_objects(self.read_lines())


class TextTail(LineTail):
    """New complete lines of a text log, decoded as UTF-8 (bad bytes replaced)."""

    def read_new(self) -> str:
        lines = self.read_lines()
        return "".join(line.decode("utf-8", "replace") + "\n" for line in lines)

    def last_lines(self, n: int, block_size: int = 65536) -> list[str]:
        """The file's last n lines, read backwards from its end (cost independent of the file's length)."""
        if n <= 0:
            return []
        try:
            with open(self.path, "rb") as f:
                end = f.seek(0, os.SEEK_END)
                data, pos = b"", end
                while pos > 0 and data.count(b"\n") <= n:
                    step = min(block_size, pos)
                    pos -= step
                    f.seek(pos)
                    data = f.read(step) + data
        except OSError:
            return []
        lines = data.decode("utf-8", "replace").splitlines()
        return lines[-n:]
