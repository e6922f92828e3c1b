"""Comments and docs cite design notes that live in this repository (docs/notes/), not elsewhere."""

from __future__ import annotations

import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# A path to a note in some notes folder, or to the design card or style guide of the brief.
CITED = re.compile(r"(?<![\w/.:-])((?:[\w.-]+/)*notes/[\w.-]+\.md|DESIGN\.md|STYLE\.md)")
SKIP = {".git", ".venv", "build", "dist", "runs", "test-artifacts", "golden", "yaml", "__pycache__"}


def text_files():
    for folder, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in SKIP and not d.startswith(".")]
        for name in files:
            if name.endswith((".py", ".sh", ".md", ".toml", ".yaml")):
                yield Path(folder) / name


def test_every_cited_note_is_in_docs_notes():
    wrong = []
    for path in text_files():
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            for cited in CITED.findall(line):
                if not (cited.startswith("docs/notes/") and (REPO / cited).is_file()):
                    wrong.append(f"{path.relative_to(REPO)}:{number} cites {cited}: cite a file under docs/notes/")
    assert wrong == []
    assert (REPO / "docs/notes/cpu-distributed.md").is_file()
