"""Files for the download buttons: the bundle as a zip and each file alone.

They are written under one folder the panel owns (a fresh temp folder per panel), in a
sub-folder named by the content's hash: the same job is written once, concurrent
sessions never clash, and no name from the page ever becomes a path.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
import threading
import weakref
from pathlib import Path

KEEP_BUNDLES = 64  # old bundle folders beyond this are deleted, oldest first
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def bundle_digest(files: dict[str, str]) -> str:
    """A short fingerprint of a bundle's files (names and contents): equal iff the bundles are."""
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]


class BundleWriter:
    def __init__(self, root: Path | None = None):
        if root:
            self.root = Path(root)
            self.root.mkdir(parents=True, exist_ok=True)
        else:  # the panel's own temp folder: removed when the panel exits, not left behind by every start
            self.root = Path(tempfile.mkdtemp(prefix="tunedeck-bundles-"))
            weakref.finalize(self, shutil.rmtree, self.root, ignore_errors=True)
        self._lock = threading.Lock()

    def write(self, files: dict[str, str], zip_name: str = "tunedeck-bundle.zip") -> tuple[Path, list[Path]]:
        """Write the files and their zip; returns (zip path, file paths in bundle order)."""
        from tunedeck.backend.render import zip_bundle

        for name in [*files, zip_name]:
            if not _SAFE_NAME.match(name):  # generator names are plain; refuse anything else
                raise ValueError(f"refusing to write a bundle file named {name!r}")
        folder = self.root / bundle_digest(files)
        paths = [folder / "files" / name for name in files]
        zip_path = folder / zip_name
        with self._lock:
            if not zip_path.exists():
                (folder / "files").mkdir(parents=True, exist_ok=True)
                for path, text in zip(paths, files.values()):
                    path.write_text(text, encoding="utf-8")
                partial = zip_path.with_suffix(".part")
                partial.write_bytes(zip_bundle(files))
                partial.replace(zip_path)  # a reader never sees half a zip
            folder.touch()
            self._prune()
        return zip_path, paths

    def _prune(self) -> None:
        folders = sorted((p for p in self.root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
        for old in folders[:-KEEP_BUNDLES]:
            shutil.rmtree(old, ignore_errors=True)


def zip_name_for(spec) -> str:
    """tunedeck-<model>-<method>-<strategy>.zip, reduced to safe characters."""
    model = Path(spec.model.name_or_path.rstrip("/")).name or "model"
    stem = f"tunedeck-{model}-{spec.method}-{spec.strategy.kind}"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", stem)[:90] + ".zip"
