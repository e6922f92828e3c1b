"""Files for the download buttons: the bundle as a zip and each file alone.

They are written under one folder the panel owns (a fresh temp folder per panel), in a
sub-folder named by the content's hash: the same job is written once, concurrent
sessions never clash, and no name from the page ever becomes a path.

Each file alone is the file the page shows: what Start runs on this machine. The zip is the
bundle as it travels (backend/render/bundle_data.py): the job's small local data files (an upload,
a data file or folder on this machine) ride in its data/ folder, its job.yaml names them
there, and its README.md lists what stays on this machine.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
import threading
import weakref
import zipfile
from pathlib import Path

KEEP_BUNDLES = 64  # old bundle folders beyond this are deleted, oldest first
KEEP_BYTES = 2**30  # and beyond this many bytes in all: a zip may carry up to 50 MiB of data
KEEP_DATA_ZIPS = 4  # the carried data, zipped once per version of the files (see _data_zip)
# A plain name, or one folder and a plain name (the recipe package: tunedeck_recipe/__init__.py).
_SAFE_NAME = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]{0,99}/)?[A-Za-z0-9_][A-Za-z0-9._-]{0,99}$")


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
        """Write the files and their zip; returns (zip path, file paths in bundle order). The zip carries the job's
        local data (the module's docstring); the files alone are those given."""
        from tunedeck.backend.render import carry

        _check_names([*files, zip_name])
        zipped, plan = carry(files)
        data = plan.files
        folder = self.root / _folder_key(files, zipped, data)
        zip_path = folder / zip_name
        with self._lock:
            paths = self._write_files(folder, files)
            if not zip_path.exists():
                partial = zip_path.with_suffix(".part")
                self._write_zip(partial, zipped, data)
                partial.replace(zip_path)  # a reader never sees half a zip
            self._prune(keep=folder)
        return zip_path, paths

    def write_files(self, files: dict[str, str]) -> list[Path]:
        """Each file alone, without the zip: what the page offers beside the files on every edit. The zip reads the
        job's data files from the disk (carry), which is for the click on ⬇ Download bundle (write)."""
        _check_names(files)
        folder = self.root / bundle_digest(files)
        with self._lock:
            paths = self._write_files(folder, files)
            self._prune(keep=folder)
        return paths

    @staticmethod
    def _write_files(folder: Path, files: dict[str, str]) -> list[Path]:
        paths = [folder / "files" / name for name in files]
        if not all(path.exists() for path in paths):
            for path, text in zip(paths, files.values()):
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
        folder.touch()
        return paths

    def _write_zip(self, target: Path, files: dict[str, str], data: dict[str, Path]) -> None:
        """zip_bundle(files, data), written from the data's zip made once: the page writes a zip on every edit, and
        deflating 50 MiB of data took 2.7 s here (copying its zip and adding the files: 0.02 s)."""
        from tunedeck.backend.render import zip_files

        if data:
            shutil.copyfile(self._data_zip(data), target)
        with zipfile.ZipFile(target, "a" if data else "w") as archive:
            zip_files(archive, files)

    def _data_zip(self, data: dict[str, Path]) -> Path:
        from tunedeck.backend.render import zip_data

        cache = self.root / ".data"
        path = cache / f"{bundle_digest(_stats(data))}.zip"
        if not path.exists():
            cache.mkdir(exist_ok=True)
            partial = path.with_suffix(".part")
            with zipfile.ZipFile(partial, "w") as archive:
                zip_data(archive, data)
            partial.replace(path)
        path.touch()
        for old in sorted(cache.glob("*.zip"), key=lambda p: p.stat().st_mtime)[:-KEEP_DATA_ZIPS]:
            old.unlink(missing_ok=True)
        return path

    def _prune(self, keep: Path) -> None:
        """The oldest bundle folders beyond KEEP_BUNDLES or KEEP_BYTES, never the one just written."""
        folders = sorted(
            (p for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")),
            key=lambda p: p.stat().st_mtime,
        )
        old, folders = folders[:-KEEP_BUNDLES], folders[-KEEP_BUNDLES:]
        sizes = [sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) for p in folders]
        while len(folders) > 1 and sum(sizes) > KEEP_BYTES and folders[0] != keep:
            old.append(folders.pop(0))
            sizes.pop(0)
        for folder in old:
            shutil.rmtree(folder, ignore_errors=True)


def _check_names(names) -> None:
    for name in names:
        if not _SAFE_NAME.match(name):  # generator names are plain; refuse anything else
            raise ValueError(f"refusing to write a bundle file named {name!r}")


def _stats(data: dict[str, Path]) -> dict[str, str]:
    """Each carried file's name in the bundle, where it is here, its size and time: a new version, a new zip."""
    found = {}
    for name, path in data.items():
        stat = path.stat()
        found[name] = f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}"
    return found


def _folder_key(files: dict[str, str], zipped: dict[str, str], data: dict[str, Path]) -> str:
    """The bundle folder's name: the files alone, the zip's and its data's versions."""
    if zipped is files and not data:
        return bundle_digest(files)
    return bundle_digest({**files, **{f"zip/{name}": text for name, text in zipped.items()}, **_stats(data)})


def zip_name_for(spec) -> str:
    """tunedeck-<model>-<method>-<strategy>.zip, reduced to safe characters."""
    model = Path(spec.model.name_or_path.rstrip("/")).name or "model"
    stem = f"tunedeck-{model}-{spec.method}-{spec.strategy.kind}"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", stem)[:90] + ".zip"
