"""Run with SkyPilot's python (tests/sky/sky_env.py): each argument is a bundle folder; SkyPilot's own loader reads
its sky.yaml (sky.Task.from_yaml validates it against SkyPilot's task schema) and what it made of it is printed as
one JSON object per line. No API server and no cloud is asked."""

import json
import os
import sys

import sky  # pyright: ignore[reportMissingImports] - SkyPilot's venv, not the panel's


def described(folder: str) -> dict:
    os.chdir(folder)  # workdir: . is the bundle
    try:
        task = sky.Task.from_yaml("sky.yaml")
    except Exception as exc:  # noqa: BLE001 - whatever SkyPilot refuses, said with the folder
        return {"folder": folder, "error": f"{type(exc).__name__}: {exc}"}
    resources = [
        {
            "accelerators": r.accelerators,
            "cpus": r.cpus,
            "infra": str(r.infra.to_str()) if r.infra and r.infra.to_str() else None,
            "use_spot": r.use_spot,
            "disk_size": r.disk_size,
        }
        for r in task.resources
    ]
    return {
        "folder": folder,
        "name": task.name,
        "num_nodes": task.num_nodes,
        "workdir": task.workdir,
        "setup": task.setup,
        "run": task.run,
        "resources": resources,
    }


for argument in sys.argv[1:]:
    print(json.dumps(described(argument)), flush=True)
