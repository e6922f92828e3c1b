"""Is an uploaded file data that training can read? Said at upload time, at a bounded cost, in the page's words.

An attack probe of ⬆ Upload data found files that were kept and then cost minutes and gigabytes, or were kept
under a wrong label: a CSV whose first row had 1,000,000 columns (an 8.9 MB notice, then a dataset preview that
ran 300 s at 5.7 GB), a 200 MB single line (the preview past 6 GB: a row is read and tokenized whole), UTF-16,
Latin-1 and binary files labelled "Parquet", and `[[[[...` ending in a RecursionError. Two checks refuse them before the file is kept, so the preview never measures one:

- `check_start(path, name)` reads at most the first MAX_ROW_BYTES (and streams a longer first line through a
  1 MiB buffer to say how long it is): empty, compressed, Parquet or binary under a text name, UTF-16/UTF-32,
  a first row that is not a JSON object or a CSV header, nests past Python's JSON reader, or has more than
  MAX_COLUMNS columns. It returns the first row's columns.
- `TextScan` is fed the whole file in the pass that digests it anyway (backend/data/uploads.py): invalid UTF-8
  (with its byte offset and line), a NUL byte, a line longer than MAX_ROW_BYTES, with a few calls per 1 MiB block
  and memory that does not grow with the file.

A UTF-8 byte-order mark is accepted as it is: datasets 5.2's JSON builder strips it (packaged_modules/json) and
its CSV builder (pandas) reads past it, so the file is kept untouched and its first column name read without it.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import shlex
from pathlib import Path

from tunedeck.backend.spec.untrusted import shown

MAX_COLUMNS = 1000  # a training row has a few text columns; a thousand is a table of features
MAX_ROW_BYTES = 4 * 2**20  # a row of 4 MiB is about a million tokens: past any model's context
_ROW_WORDS = "4 MiB (about a million tokens, longer than any model reads)"
BLOCK = 2**20
TEXT_SUFFIXES = (".jsonl", ".json", ".csv")
PARQUET_MAGIC = b"PAR1"  # a Parquet file begins and ends with it
# What a file is by its first bytes, when a text file's name says otherwise; and how to get the data out of it.
MAGIC = (
    (b"\x1f\x8b", "gzip-compressed", "decompress it first (gunzip -k {name})"),
    (b"PK\x03\x04", "a zip archive", "unzip it and upload the data file inside"),
    (b"\xfd7zXZ\x00", "xz-compressed", "decompress it first (unxz -k {name})"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed", "decompress it first (unzstd {name})"),
    (b"SQLite format 3\x00", "an SQLite database", "export its table to JSONL or CSV"),
)
BOMS = (  # UTF-32 first: its little-endian mark begins with UTF-16's
    (codecs.BOM_UTF32_LE, "UTF-32"),
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)


class NotData(ValueError):
    """A file training cannot read as it is: the message names it, says what it is and how to fix it."""


def check_start(path: Path, name: str) -> list[str] | None:
    """The first row's columns of an uploaded data file (None for Parquet, whose columns are not read here);
    NotData when the start of the file shows that training cannot read it. Reads at most MAX_ROW_BYTES + 1."""
    with open(path, "rb") as f:
        head = f.read(MAX_ROW_BYTES + 1)
        whole = len(head) <= MAX_ROW_BYTES
        suffix = Path(name).suffix.lower()
        if not head:
            raise NotData(f"{shown(name)} is empty (0 bytes): export the data again and upload the file with its rows")
        if suffix == ".parquet":
            _check_parquet(f, head, name)
            return None
        _check_text_bytes(head, name)
        text = _utf8_prefix(head, whole, name)
        if not text.strip():
            raise NotData(f"{shown(name)} has no rows (only blank lines): export the data again")
        if suffix == ".csv":
            return _csv_header(f, head, text, whole, name)
        if suffix == ".json" and text.lstrip().startswith("["):
            return _array_first_row(text, whole, name)
        return _json_line_row(f, head, text, whole, name)


def _check_parquet(f, head: bytes, name: str) -> None:
    if not head.startswith(PARQUET_MAGIC):
        kind = _what_text_is(head)
        raise NotData(
            f"{shown(name)} is not a Parquet file (Parquet begins with the bytes PAR1; this begins like {kind}): "
            "name it for what it is (.jsonl, .json or .csv) and upload it again"
        )
    f.seek(0, io.SEEK_END)
    size = f.tell()
    f.seek(max(0, size - 4))
    if size < 12 or f.read(4) != PARQUET_MAGIC:
        raise NotData(
            f"{shown(name)} is cut short: it begins as Parquet but does not end with PAR1 as a whole Parquet file "
            "does; upload the whole file again"
        )


def _check_text_bytes(head: bytes, name: str) -> None:
    """Refuse what is not UTF-8 text by its first bytes: a Parquet or compressed file, UTF-16/32, binary."""
    if head.startswith(PARQUET_MAGIC):
        raise NotData(f"{shown(name)} is a Parquet file, not text: rename it to .parquet and upload it again")
    for magic, kind, fix in MAGIC:
        if head.startswith(magic):
            raise NotData(f"{shown(name)} is {kind}, not text: {fix.format(name=_quoted(name))}")
    encoding = _wide_encoding(head)
    if encoding:
        raise NotData(
            f"{shown(name)} is {encoding} text; training reads UTF-8: convert it with "
            f"iconv -f {encoding} -t UTF-8 {_quoted(name)} > {_quoted(_renamed(name, '-utf8'))} and upload that"
        )
    nul = head.find(b"\0")
    if nul >= 0:
        raise NotData(_binary(name, nul, head.count(b"\n", 0, nul) + 1))


def _wide_encoding(head: bytes) -> str | None:
    """UTF-16 or UTF-32 by its byte-order mark, or UTF-16 without one by its pattern: ASCII text in UTF-16 has a
    NUL in every other byte (odd bytes for little-endian, even for big-endian) and none in the others."""
    for bom, encoding in BOMS:
        if head.startswith(bom):
            return encoding
    sample = head[:4096]
    pairs = len(sample) // 2
    if pairs < 2:
        return None
    nul_even, nul_odd = sample[0 : 2 * pairs : 2].count(0), sample[1 : 2 * pairs : 2].count(0)
    if min(nul_even, nul_odd) == 0 and max(nul_even, nul_odd) >= pairs * 0.4:
        return "UTF-16"
    return None


def _utf8_prefix(head: bytes, whole: bool, name: str) -> str:
    """The head as text (a UTF-8 BOM dropped); a multi-byte character cut by the head's end is left out."""
    decoder = codecs.getincrementaldecoder("utf-8-sig")()
    try:
        return decoder.decode(head, final=whole)
    except UnicodeDecodeError as exc:
        raise NotData(_not_utf8(name, exc.start, head[exc.start], head.count(b"\n", 0, exc.start) + 1)) from None


def _csv_header(f, head: bytes, text: str, whole: bool, name: str) -> list[str]:
    if text.lstrip().startswith(("{", "[")):
        raise NotData(f"{shown(name)} holds JSON, not CSV: rename it to .jsonl (one object a line) or .json")
    end = head.find(b"\n")
    if end < 0 and not whole:  # a first line longer than a row may be: how many columns, by its commas
        rest, commas = _stream_to_newline(f, lambda block: block.count(b","))
        if head.count(b",") + commas + 1 > MAX_COLUMNS:
            raise NotData(_too_many_columns(name, head.count(b",") + commas + 1))
        raise NotData(_too_long(name, 1, len(head) + rest))
    try:
        header = next((row for row in csv.reader(io.StringIO(text)) if row), [])
    except csv.Error as exc:
        raise NotData(f"the first row of {shown(name)} is not CSV ({exc}): save it again as CSV") from None
    if len(header) > MAX_COLUMNS:
        raise NotData(_too_many_columns(name, len(header)))
    return header


def _json_line_row(f, head: bytes, text: str, whole: bool, name: str) -> list[str]:
    """JSON Lines, and a .json that begins with an object: the datasets library reads one object after another
    (pyarrow's JSON reader takes them pretty-printed too), so the first row is the first whole JSON value."""
    start = len(text) - len(text.lstrip())
    number = text.count("\n", 0, start) + 1  # the first line with something on it
    if text.find("\n", start) < 0 and not whole:
        raise NotData(_too_long(name, number, len(head) + _stream_to_newline(f, len)[0]))
    if not text.startswith("{", start):
        begins = shown(text[start:].partition("\n")[0], 24)
        raise NotData(
            f"line {number} of {shown(name)} is not a JSON object (it begins {begins!r}): JSON Lines holds one "
            'object a line, like {"text": "..."}; a CSV file is named .csv'
        )
    return _columns(_first_value(text[start:], whole, name, f"line {number}", number - 1), name, f"line {number}")


def _array_first_row(text: str, whole: bool, name: str) -> list[str]:
    """A .json that is an array of rows: the datasets library reads it whole; here only its first row is read."""
    body = text.lstrip()[1:].lstrip()
    if body.startswith("]"):
        raise NotData(f"{shown(name)} is an empty JSON array: it has no rows to train on")
    lines_before = text.count("\n", 0, len(text) - len(body))
    row = _first_value(body, whole, name, "the first row", lines_before)
    if isinstance(row, str):
        return ["text"]  # the datasets library reads an array of strings as a text column
    return _columns(row, name, "the first row")


def _first_value(text: str, whole: bool, name: str, where: str, lines_before: int):
    """The JSON value text begins with; NotData when it is not JSON, nests too deep, or runs past the head."""
    try:
        return json.JSONDecoder().raw_decode(text)[0]
    except RecursionError:
        raise NotData(_too_deep(name, where)) from None
    except json.JSONDecodeError as exc:
        if not whole and (exc.msg.startswith("Unterminated string") or exc.pos >= len(text)):  # the head's end
            raise NotData(
                f"{where} of {shown(name)} runs past its first {_ROW_WORDS} without ending: is it training text? "
                "A row longer than that is not read"
            ) from None
        raise NotData(
            f"{where} of {shown(name)} is not JSON: {exc.msg} at line {exc.lineno + lines_before:,}, column "
            f"{exc.colno:,}; save it again as JSON Lines (one object a line) or a JSON array of objects"
        ) from None


def _columns(row, name: str, where: str) -> list[str]:
    if not isinstance(row, dict):
        raise NotData(
            f"{where} of {shown(name)} is a JSON {_json_kind(row)}, not an object: each row is an object of "
            'columns, like {"text": "..."} or {"messages": [...]}'
        )
    if len(row) > MAX_COLUMNS:
        raise NotData(_too_many_columns(name, len(row)))
    return list(row)


class TextScan:
    """Fed a text file's blocks in order (each at most MAX_ROW_BYTES): the first invalid UTF-8 byte, NUL byte or
    line longer than MAX_ROW_BYTES is NotData. `lines`: whether line length matters (not in a JSON array, which
    the datasets library reads whole, and which may well be one line).

    Measured on a 2-core machine shared with other work, per 200 MB: 0.39 s to digest it (sha256), 0.03 s to find
    NUL bytes, 0.93 s to decode text that is mostly not ASCII (an ASCII block is skipped in microseconds), 0.2 s to
    count line breaks: so they are counted only to name the line of a refusal, by reading the file again."""

    def __init__(self, path: Path, name: str, lines: bool = True):
        self.path, self.name, self.lines = path, name, lines
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self._offset = 0  # bytes fed before this block
        self._run = 0  # bytes since the last line break

    def feed(self, block: bytes) -> None:
        pending = self._decoder.getstate()[0]  # the start of a character cut by the last block's end
        if pending or not block.isascii():
            try:
                self._decoder.decode(block)
            except UnicodeDecodeError as exc:
                at = self._offset - len(pending) + exc.start  # before this block when the last one began it
                raise NotData(_not_utf8(self.name, at, (pending + block)[exc.start], self._line_at(at))) from None
        nul = block.find(b"\0")
        if nul >= 0:
            raise NotData(_binary(self.name, self._offset + nul, self._line_at(self._offset + nul)))
        if self.lines:
            self._check_lines(block)
        self._offset += len(block)

    def _check_lines(self, block: bytes) -> None:
        """A line inside one block is short enough: only the run of bytes without a line break that crosses
        blocks can be too long, and it is counted without looking at every line."""
        first, last = block.find(b"\n"), block.rfind(b"\n")
        if self._run + (len(block) if first < 0 else first) > MAX_ROW_BYTES:
            raise NotData(_too_long(self.name, self._line_at(self._offset)))
        self._run = self._run + len(block) if first < 0 else len(block) - last - 1

    def finish(self) -> None:
        try:
            self._decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            raise NotData(
                f"{shown(self.name)} ends inside a UTF-8 character (byte {self._offset:,}): it was cut short; "
                "upload the whole file again"
            ) from None

    def _line_at(self, offset: int) -> int:
        """The number of the line that byte `offset` is on."""
        newlines = 0
        with open(self.path, "rb") as f:
            while offset > 0:
                block = f.read(min(BLOCK, offset))
                if not block:
                    break
                newlines, offset = newlines + block.count(b"\n"), offset - len(block)
        return newlines + 1


def scan_for(path: Path, name: str) -> TextScan | None:
    """The scan an uploaded file gets in its digest pass: text files only; a JSON array's lines are not rows."""
    suffix = Path(name).suffix.lower()
    if suffix not in TEXT_SUFFIXES:
        return None
    with open(path, "rb") as f:
        array = f.read(4096).removeprefix(codecs.BOM_UTF8).lstrip().startswith(b"[")
    return TextScan(path, name, lines=not (suffix == ".json" and array))


def _stream_to_newline(f, measure) -> tuple[int, int]:
    """(bytes up to the next line break, measure(block) summed over them), reading on from f's position."""
    size = total = 0
    for block in iter(lambda: f.read(BLOCK), b""):
        end = block.find(b"\n")
        part = block if end < 0 else block[:end]
        size, total = size + len(part), total + measure(part)
        if end >= 0:
            break
    return size, total


def _too_long(name: str, line: int, size: int | None = None) -> str:
    length = f"is {size / 2**20:,.1f} MiB long" if size else "runs past 4 MiB"
    return (
        f"line {line:,} of {shown(name)} {length} without a line break; tunedeck reads rows of at most "
        f"{_ROW_WORDS}: is it training text, one row a line?"
    )


def _too_many_columns(name: str, count: int) -> str:
    return (
        f"the first row of {shown(name)} has {count:,} columns; tunedeck reads at most {MAX_COLUMNS:,}: is it a "
        "table of features rather than training text? Keep the text columns (prompt, completion, messages...)"
    )


def _too_deep(name: str, where: str) -> str:
    return (
        f"{where} of {shown(name)} nests lists or objects more deeply than Python's JSON reader follows (about "
        'a thousand levels); a row is an object of text columns, like {"messages": [{"role": ..., "content": ...}]}'
    )


def _binary(name: str, offset: int, line: int) -> str:
    return (
        f"{shown(name)} is binary, not text: it has a NUL byte at byte {offset:,} (line {line:,}); upload the data "
        "as JSONL, JSON, CSV or Parquet"
    )


def _not_utf8(name: str, offset: int, byte: int, line: int) -> str:
    return (
        f"{shown(name)} is not UTF-8: byte 0x{byte:02X} at byte {offset:,} (line {line:,}) is not valid UTF-8. If it "
        f"is Latin-1 or Windows-1252 text, convert it with iconv -f WINDOWS-1252 -t UTF-8 {_quoted(name)} > "
        f"{_quoted(_renamed(name, '-utf8'))} and upload that"
    )


def _what_text_is(head: bytes) -> str:
    start = head.removeprefix(codecs.BOM_UTF8).lstrip()[:1]
    if start in (b"{", b"["):
        return "JSON"
    return "text" if start and b"\0" not in head[:4096] else "something else"


def _json_kind(value) -> str:
    return {list: "list", str: "string", bool: "true/false", type(None): "null"}.get(type(value), "number")


def _quoted(name: str) -> str:
    """The file's name as a shell word, or FILE when it is too long or odd to print."""
    return shlex.quote(name) if shown(name, 80) == name else "FILE"


def _renamed(name: str, tail: str) -> str:
    path = Path(name)
    return f"{path.stem}{tail}{path.suffix}"
