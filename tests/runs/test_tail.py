"""The incremental readers: only appended bytes, partial lines kept, replaced files re-read."""

from __future__ import annotations

import json
import os

from tunedeck.backend.runs.tail import JsonlTail, TextTail


def append(path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)


def test_jsonl_tail_returns_each_record_once_and_waits_for_complete_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    tail = JsonlTail(path)
    assert tail.read_new() == []  # no file yet
    append(path, json.dumps({"step": 1}) + "\n" + json.dumps({"step": 2}) + "\n")
    assert [r["step"] for r in tail.read_new()] == [1, 2]
    assert tail.read_new() == []
    # The writer is mid-line: nothing yet, then the whole record once it is complete.
    append(path, '{"step": 3, "lo')
    assert tail.read_new() == []
    append(path, 'ss": 0.5}\n{"step": 4}\n')
    assert tail.read_new() == [{"step": 3, "loss": 0.5}, {"step": 4}]


def test_jsonl_tail_skips_lines_that_are_not_objects(tmp_path):
    path = tmp_path / "metrics.jsonl"
    append(path, 'not json\n[1, 2]\n{"ok": true}\n')
    assert JsonlTail(path).read_new() == [{"ok": True}]


def test_tail_rereads_a_replaced_or_truncated_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    tail = JsonlTail(path)
    append(path, '{"run": 1}\n{"run": 1}\n')
    assert len(tail.read_new()) == 2
    replacement = tmp_path / "new.jsonl"
    append(replacement, '{"run": 2}\n')
    os.replace(replacement, path)  # a new file at the same path
    assert tail.read_new() == [{"run": 2}]
    path.write_text('{"r": 3}\n')  # truncated and rewritten in place, shorter than what was read
    assert tail.read_new() == [{"r": 3}]


def test_text_tail_keeps_utf8_split_across_reads(tmp_path):
    path = tmp_path / "rank0.log"
    tail = TextTail(path)
    data = "étape 1 ✓\n".encode()
    with open(path, "ab") as f:
        f.write(data[:3])  # cut inside the two-byte "é" ... and before the newline
    assert tail.read_new() == ""
    with open(path, "ab") as f:
        f.write(data[3:] + b"next\n")
    assert tail.read_new() == "étape 1 ✓\nnext\n"


def test_last_lines_reads_from_the_end(tmp_path):
    path = tmp_path / "rank0.log"
    path.write_text("".join(f"line {i}\n" for i in range(10_000)))
    tail = TextTail(path)
    assert tail.last_lines(3, block_size=64) == ["line 9997", "line 9998", "line 9999"]
    assert tail.last_lines(0) == []
    assert TextTail(tmp_path / "missing.log").last_lines(5) == []
    short = tmp_path / "short.log"
    short.write_text("only\n")
    assert TextTail(short).last_lines(5) == ["only"]
