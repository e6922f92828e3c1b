"""SkyPilot's managed jobs, asked through SkyPilot's own Python SDK; run with SkyPilot's python, never imported.

SkyPilot pins libraries older than the panel's (click, uvicorn), so it lives in an environment of its own and
tunedeck runs this file with that environment's python (backend/runs/sky_runs.py finds it from `sky`'s own
script). Standard library and `sky` only. Each verb prints one JSON object; a failure prints {"error": ...}
and exits 1. The SDK rather than the CLI: `sky jobs launch --async` prints a request id, not the job's, and
`sky jobs queue` prints a table for people.

    python sky_jobs.py check                    # {"enabled": ["kubernetes", ...]}: the infra `sky check` enabled
    python sky_jobs.py launch FOLDER NAME OUT   # submits FOLDER/sky.yaml as managed job NAME; OUT: {"job_id": N}
    python sky_jobs.py queue ID                 # {"job": {status, failure_reason, details, ...}} or {"job": null}
    python sky_jobs.py cancel ID                # {"cancelled": ID}
"""

import json
import os
import sys
import traceback

import sky  # pyright: ignore[reportMissingImports] - SkyPilot's environment, not the panel's
from sky.client import sdk  # pyright: ignore[reportMissingImports]

FIELDS = ("job_id", "job_name", "status", "failure_reason", "details", "recovery_count", "infra", "resources")
FIELDS += ("submitted_at", "start_at", "end_at")


def _check() -> dict:
    return {"enabled": [str(name).lower() for name in sky.get(sdk.enabled_clouds())]}


def _launch(folder: str, name: str) -> dict:
    os.chdir(folder)  # the task's workdir (.) is the run folder
    job_ids, _ = sky.get(sky.jobs.launch(sky.Task.from_yaml("sky.yaml"), name=name))
    return {"job_id": int(job_ids[0])}


def _plain(value):
    value = getattr(value, "value", value)  # ManagedJobStatus.RUNNING -> "RUNNING"
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


def _queue(job_id: int) -> dict:
    records = sky.get(sky.jobs.queue_v2(refresh=False, all_users=True, job_ids=[job_id]))
    records = records[0] if isinstance(records, tuple) else records  # (records, total, ...) since 0.12
    for record in records:
        record = record if isinstance(record, dict) else record.model_dump()
        if int(record.get("job_id") or -1) == job_id:
            return {"job": {key: _plain(record.get(key)) for key in FIELDS}}
    return {"job": None}


def _cancel(job_id: int) -> dict:
    sky.get(sky.jobs.cancel(job_ids=[job_id]))
    return {"cancelled": job_id}


def _write(path: str, answer: dict) -> None:
    partial = f"{path}.part"
    with open(partial, "w", encoding="utf-8") as out:
        json.dump(answer, out)
    os.replace(partial, path)  # a reader sees the whole answer or none


def main(argv: list[str]) -> int:
    verb, args = argv[0], argv[1:]
    out = args[2] if verb == "launch" else None
    try:
        if verb == "check":
            answer = _check()
        elif verb == "launch":
            answer = _launch(args[0], args[1])
        elif verb == "queue":
            answer = _queue(int(args[0]))
        elif verb == "cancel":
            answer = _cancel(int(args[0]))
        else:
            answer = {"error": f"unknown verb {verb!r}"}
    except Exception as exc:  # noqa: BLE001 - SkyPilot's own words, for the run's error line
        traceback.print_exc()  # the whole story, for the launcher log
        answer = {"error": f"{type(exc).__name__}: {exc}".strip()[:2000]}
    if out:
        _write(out, answer)
    print(json.dumps(answer), flush=True)
    return 1 if "error" in answer else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
