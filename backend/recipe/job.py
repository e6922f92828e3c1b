"""The job's two YAML files, and the error that speaks to the person who wrote them."""

from __future__ import annotations

from pathlib import Path


class JobError(Exception):
    """A problem with the job's inputs, worded for the person who wrote the job."""


def read_yaml(path: Path, what: str) -> dict:
    import yaml  # PyYAML: imported here, so that tunedeck's panel reads the recipe without it

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise JobError(f"{what} not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise JobError(f"{what} ({path}) cannot be read: {exc}") from None
    except yaml.YAMLError as exc:
        raise JobError(f"{what} ({path}) is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise JobError(f"{what} ({path}) must be a YAML mapping")
    return data
