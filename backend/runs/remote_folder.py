"""A run folder on a cluster, mirrored into the local run folder over one SSH link.

upload() sends the bundle once (a tar stream into the remote runs folder). pull() brings back what
changed since the last pull: a file that only grows (metrics.jsonl, the rank logs) from the byte
the mirror already holds, any other file whole when its size or time changed, and a file gone there
is removed here. So a tick of a long run costs what it appended, not what it holds; the remote side
is one short Python program (the standard library only) that answers in one round trip. Files the
readers keep here (status.json, notes.json, the mirror's own state) never travel, and neither do the
weights: checkpoints stay on the cluster until fetched on demand (fetch()).
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import tarfile
from pathlib import Path

from tunedeck.backend.runs.folder import NOTES_FILE, RESERVE_FILE, STATUS_FILE
from tunedeck.backend.runs.ssh_link import SshLink

MIRROR_FILE = ".mirror.json"  # {relative path: [size, mtime_ns]} of what the mirror holds
MIRROR_LOCK = ".mirror.lock"  # the panel and a CLI may pull the same run at once
LOCAL_FILES = {STATUS_FILE, NOTES_FILE, RESERVE_FILE, MIRROR_FILE, MIRROR_LOCK}
PULL_LIMIT = 8 * 1024 * 1024  # bytes one pull brings at most; the rest comes with the next
WHOLE_LIMIT = 2 * 1024 * 1024  # a file larger than this is never pulled whole (weights, optimizer states)
GROWING_SUFFIXES = (".jsonl", ".log", ".out", ".err")  # appended to, never rewritten

# Runs on the login node as `python3 -c PULL_PROGRAM`, the request on stdin. Prints one JSON line (what
# changed), then the changed bytes back to back in that order.
PULL_PROGRAM = r"""
import json, os, stat, sys
ask = json.load(sys.stdin)
root, known, budget = ask["folder"], ask["known"], ask["limit"]
skip, growing, whole_limit = set(ask["skip"]), tuple(ask["growing"]), ask["whole_limit"]
listed, changed, chunks = [], {}, []
for folder, dirs, files in os.walk(root):
    dirs[:] = sorted(d for d in dirs if not d.startswith("checkpoint-") and d != ".incomplete")
    for name in sorted(files):
        path = os.path.join(folder, name)
        rel = os.path.relpath(path, root)
        if rel in skip:
            continue
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISREG(info.st_mode):
            continue  # a link could point anywhere on the login node
        listed.append(rel)
        had = known.get(rel)
        if had == [info.st_size, info.st_mtime_ns]:
            continue
        grows = rel.endswith(growing)
        start = had[0] if had and grows and info.st_size >= had[0] else 0
        if not grows and info.st_size > whole_limit:
            changed[rel] = {"size": info.st_size, "mtime": info.st_mtime_ns, "skipped": True}
            continue
        want = info.st_size - start
        if want > budget:
            if not grows:
                continue  # whole or not at all: it comes with a later pull
            want = budget
        with open(path, "rb") as handle:
            handle.seek(start)
            data = handle.read(want)
        budget -= len(data)
        whole = start + len(data) >= info.st_size
        changed[rel] = {"size": start + len(data), "mtime": info.st_mtime_ns if whole else 0,
                        "start": start, "length": len(data)}
        chunks.append(data)
out = sys.stdout.buffer
out.write(json.dumps({"listed": listed, "changed": changed}).encode() + b"\n")
for data in chunks:
    out.write(data)
"""


class RemoteFolderError(Exception):
    """The login node answered, but not as a run folder should (a missing python3, a full disk)."""


def upload(link: SshLink, local_dir: Path, remote_dir: str) -> str:
    """Send the run folder (but the files kept here) to remote_dir; its absolute path there."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path in sorted(local_dir.rglob("*")):
            rel = path.relative_to(local_dir).as_posix()
            if rel not in LOCAL_FILES:
                archive.add(path, arcname=rel, recursive=False)
    script = 'mkdir -p -- "$1" && cd -- "$1" && tar -xf - && pwd'  # the folder is an argument: data, never code
    done = link.run(["sh", "-c", script, "sh", remote_dir], data=buffer.getvalue(), timeout=300)
    if done.returncode:
        raise RemoteFolderError(f"cannot write {remote_dir} on {link.name}: {_said(done)}")
    return done.stdout.decode().strip().splitlines()[-1]


def put_file(link: SshLink, remote_dir: str, name: str, data: bytes) -> None:
    """Write one file of the remote run folder (replaced whole, at once)."""
    script = 'cd -- "$1" && cat > "$2.tmp" && mv -f -- "$2.tmp" "$2"'
    done = link.run(["sh", "-c", script, "sh", remote_dir, name], data=data)
    if done.returncode:
        raise RemoteFolderError(f"cannot write {name} in {remote_dir} on {link.name}: {_said(done)}")


def pull(link: SshLink, remote_dir: str, local_dir: Path) -> int:
    """Bring local_dir up to date with remote_dir; how many bytes came. SshUnreachable when the link is down."""
    with _locked(local_dir):
        known = _known(local_dir)
        ask = {
            "folder": remote_dir,
            "known": known,
            "limit": PULL_LIMIT,
            "skip": sorted(LOCAL_FILES),
            "growing": list(GROWING_SUFFIXES),
            "whole_limit": WHOLE_LIMIT,
        }
        done = link.run(["python3", "-c", PULL_PROGRAM], data=json.dumps(ask).encode(), timeout=120)
        if done.returncode:
            raise RemoteFolderError(f"cannot read {remote_dir} on {link.name}: {_said(done)}")
        head, _, body = done.stdout.partition(b"\n")
        answer = json.loads(head)
        for rel, change in answer["changed"].items():
            if change.get("skipped"):
                known[rel] = [change["size"], change["mtime"]]  # listed, never copied: fetch() brings it
                continue
            data = body[: change["length"]]
            body = body[change["length"] :]
            _write(local_dir, rel, change["start"], data)
            known[rel] = [change["size"], change["mtime"]]
        for rel in set(known) - set(answer["listed"]):
            with contextlib.suppress(FileNotFoundError):
                _confined(local_dir, rel).unlink()
            del known[rel]
        (local_dir / MIRROR_FILE).write_text(json.dumps(known), encoding="utf-8")
        return len(done.stdout) - len(head) - 1


def fetch(link: SshLink, remote_dir: str, local_dir: Path, sub: str, exclude: str | None = None) -> Path:
    """Copy one folder of the run (a checkpoint, the final model) here whole, on demand; its local path.
    `exclude`: a tar pattern of what stays there (the checkpoints, when the final model is fetched)."""
    target = _confined(local_dir, sub)
    leave = [f"--exclude={exclude}"] if exclude else []
    done = link.run(["tar", "-c", "-f", "-", *leave, "-C", remote_dir, "--", sub], timeout=3600)
    if done.returncode:
        raise RemoteFolderError(f"cannot read {sub} of {remote_dir} on {link.name}: {_said(done)}")
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as archive:
        archive.extractall(local_dir, filter="data")  # no links out of the folder, no absolute paths
    return target


def _known(local_dir: Path) -> dict[str, list[int]]:
    try:
        known = json.loads((local_dir / MIRROR_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}


def _write(local_dir: Path, rel: str, start: int, data: bytes) -> None:
    path = _confined(local_dir, rel)
    path.parent.mkdir(parents=True, exist_ok=True)
    if start:
        with open(path, "r+b" if path.exists() else "w+b") as handle:
            handle.seek(start)
            handle.write(data)
            handle.truncate()
        return
    partial = path.with_name(path.name + ".pulling")
    partial.write_bytes(data)
    os.replace(partial, path)  # a reader never sees half a file


def _confined(local_dir: Path, rel: str) -> Path:
    """local_dir/rel, refused when rel leads out of the folder (a remote side is never trusted with paths)."""
    path = (local_dir / rel).resolve()
    if not path.is_relative_to(local_dir.resolve()) or path == local_dir.resolve():
        raise RemoteFolderError(f"the remote folder named a path outside the run folder: {rel!r}")
    return path


@contextlib.contextmanager
def _locked(local_dir: Path):
    with open(local_dir / MIRROR_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _said(done) -> str:
    lines = done.stderr.decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else f"exit code {done.returncode}"
