"""notes.json: what people call a run and what they noted about it (the panel, `tunedeck runs note`).

Written by the readers' side only, never by the run (backend/runs/folder.py names the file).
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from tunedeck.backend.runs.folder import NOTES_FILE

NAME_MAX_CHARS = 80  # a name is a table cell
NOTES_MAX_CHARS = 4000


class RunNotes(BaseModel):
    """notes.json: what people call a run and what they noted about it."""

    name: str = Field(default="", max_length=NAME_MAX_CHARS)
    notes: str = Field(default="", max_length=NOTES_MAX_CHARS)


class NotesError(ValueError):
    """A name or notes that cannot be stored; the message names the field and the fix."""


def read_notes(run_dir: Path) -> RunNotes:
    """The run's name and notes (both empty when none were set, or the file is damaged)."""
    try:
        return RunNotes.model_validate_json((Path(run_dir) / NOTES_FILE).read_bytes())
    except (OSError, ValidationError):
        return RunNotes()


def write_notes(run_dir: Path, name: str, notes: str) -> RunNotes:
    """Store a run's name (one line) and notes; NotesError when either cannot be stored as given."""
    from tunedeck.backend.spec.untrusted import describe_char, unsafe_char

    name, notes = name.strip(), notes.strip()
    for label, text, allowed in (("name", name, ""), ("notes", notes, "\n\t")):
        bad = unsafe_char(text.translate({ord(c): " " for c in allowed}))  # escapes would rewrite a terminal
        if bad is not None:
            raise NotesError(f"{label}: {describe_char(text[bad])} at character {bad + 1}: type plain text")
    for label, text, limit in (("name", name, NAME_MAX_CHARS), ("notes", notes, NOTES_MAX_CHARS)):
        if len(text) > limit:
            raise NotesError(f"{label}: {len(text)} characters, at most {limit}: shorten it")
    if not Path(run_dir).is_dir():
        raise NotesError(f"the run folder {run_dir} is gone: its notes cannot be stored")
    stored = RunNotes(name=name, notes=notes)
    tmp = Path(run_dir) / f".{NOTES_FILE}.{os.getpid()}.tmp"
    try:  # atomic replace: a reader never sees half a file
        tmp.write_text(stored.model_dump_json(indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, Path(run_dir) / NOTES_FILE)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise NotesError(
            f"notes: cannot be written to {run_dir} ({exc.strerror or exc}): free space on its disk"
        ) from None
    return stored
