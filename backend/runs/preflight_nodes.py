"""The node check of a Slurm run (launch.slurm.preflight): does the environment on the nodes hold the training stack?

Before the run's slurm.sbatch is submitted, one short srun on one node of the job's partition runs
what each node of the job will run: the run folder's setup.sh (launch.slurm.setup), in the job's
container (launch.slurm.container), then a few lines of Python that import the stack of the
bundle's requirements.txt and print what they found as JSON. A package that is missing, or older
than the version the bundle pins, is an error that names the field to fix, and the run is not
submitted: its folder is removed, as for every refused Start. A node that cannot be had within
IMMEDIATE_S, or a check that outlasts its timeout, tells nothing: the run is submitted, and the
check's words are kept in the run folder (NODES_FILE).

Everything goes to srun as an argv list; the spec's values are single words of it (render/slurm_env.py).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

from tunedeck.backend.render.requirements import packages, tested_versions
from tunedeck.backend.render.slurm_env import SETUP_FAILED, in_folder, node_argv
from tunedeck.backend.runs import slurm_jobs
from tunedeck.backend.runs.preflight import refusal
from tunedeck.backend.runs.slurm_jobs import SlurmUnavailable
from tunedeck.backend.runs.ssh_link import SshLink
from tunedeck.backend.spec import JobSpec
from tunedeck.backend.spec.env import environment
from tunedeck.backend.spec.problem import Problem, error, warning

NODES_FILE = "preflight_nodes.json"
REPORT_MARK = "TUNEDECK_PREFLIGHT "
IMMEDIATE_S = 60  # srun gives up when no node is free this long: a busy cluster must not hold Start
TIMEOUT_S = 180.0
CONTAINER_TIMEOUT_S = 600.0  # a first pull of a large image on the node
# The module each distribution of requirements.txt is imported as.
MODULES = {"PyYAML": "yaml", "nvidia-ml-py": "pynvml", "liger-kernel": "liger_kernel"}

# Runs on the node, under the environment's python3: imports each package, prints one line of JSON.
CHECK = """
import json, os, shutil, sys
from importlib import import_module, metadata
report = {"node": os.environ.get("SLURMD_NODENAME", ""), "python": sys.executable, "packages": {}, "missing": {},
          "accelerate_command": shutil.which("accelerate")}
for dist, module in json.loads(sys.argv[1]).items():
    try:
        import_module(module)
        report["packages"][dist] = metadata.version(dist)
    except Exception as exc:  # not installed, or an install that breaks on import
        report["missing"][dist] = (type(exc).__name__ + ": " + str(exc))[:300]
if sys.argv[2] == "gpu" and "torch" in report["packages"]:
    import torch
    report["gpus"] = torch.cuda.device_count()
print("TUNEDECK_PREFLIGHT " + json.dumps(report), flush=True)  # REPORT_MARK
"""


def check_argv(spec: JobSpec, run_dir: str) -> list[str]:
    """The srun that checks one node, run from the run folder `run_dir` (a path every node sees)."""
    slurm = spec.launch.slurm
    argv = ["srun", "--nodes=1", "--ntasks=1", "--job-name=tunedeck-preflight", f"--chdir={run_dir}"]
    argv += [f"--{name}={getattr(slurm, name)}" for name in ("partition", "account", "qos") if getattr(slurm, name)]
    argv += ["--time=5", f"--immediate={IMMEDIATE_S}", "--kill-on-bad-exit=1"]
    if not spec.launch.use_cpu:
        argv.append("--gpus=1")  # the job's node kind, and whether its torch sees the GPU
    wanted = {name: MODULES.get(name, name.replace("-", "_")) for name in packages(spec)}
    device = "cpu" if spec.launch.use_cpu else "gpu"
    # launch.env as launch.sh exports it (a PATH there chooses the python3 that trains), as `env NAME=value` words.
    # The check's code, its data and these words are arguments, never part of the script.
    script = 'code=$1 wanted=$2 device=$3; shift 3; exec env "$@" python3 -c "$code" "$wanted" "$device"'
    exports = [f"{name}={value}" for name, value in environment(spec.launch.env).items()]
    options, command = node_argv(spec, script, "tunedeck-preflight", CHECK, json.dumps(wanted), device, *exports)
    return [*argv, *in_folder([*options, *command], run_dir)]


def field_to_fix(spec: JobSpec) -> str:
    """Where the nodes' environment is set: the container's image, else the setup lines."""
    return "launch.slurm.container.image" if spec.launch.slurm.container.image else "launch.slurm.setup"


def check_nodes(
    spec: JobSpec, folder: str, env: dict[str, str], via: SshLink | None = None
) -> tuple[list[Problem], dict]:
    """(problems, the node's report) of the environment on one node, checked from the run folder `folder` (on
    the login node when `via` is a link: launch.slurm.ssh)."""
    timeout = CONTAINER_TIMEOUT_S if spec.launch.slurm.container.image else TIMEOUT_S
    try:
        done = slurm_jobs.run(check_argv(spec, folder), env=env, timeout=timeout, cwd=folder, via=via)
    except SlurmUnavailable as exc:  # srun missing, or the check outlasted its timeout
        return [warning("launch.slurm.preflight", f"the node check did not run to its end: {exc}")], {}
    report = next(
        (json.loads(line[len(REPORT_MARK) :]) for line in done.stdout.splitlines() if line.startswith(REPORT_MARK)),
        None,
    )
    if report is None:
        return [_no_report(spec, done)], {"exit_code": done.returncode, "stderr": _tail(done.stderr)}
    return stack_problems(spec, report), report


def _no_report(spec: JobSpec, done: subprocess.CompletedProcess) -> Problem:
    said = _tail(done.stderr) or _tail(done.stdout) or f"exit status {done.returncode}"
    if "Unable to allocate resources" in done.stderr and any(
        word in done.stderr for word in ("mmediate", "busy", "Resources")
    ):  # no free node within IMMEDIATE_S: nothing is known of the environment
        return warning("launch.slurm.preflight", f"no node was free for the node check, so it did not run ({said})")
    if done.returncode == SETUP_FAILED:
        return error(
            "launch.slurm.setup",
            f"the setup lines failed on the node ({said}): fix the failing line of launch.slurm.setup",
        )
    if done.returncode == 127 and "python3" in done.stderr:
        return error(
            field_to_fix(spec),
            f"the node has no python3 after the setup lines ({said}): activate the environment that holds the "
            f"training stack in {field_to_fix(spec)}",
        )
    return error(
        field_to_fix(spec),
        f"the node check did not run ({said}): fix {field_to_fix(spec)}, or the Slurm settings srun names",
    )


def stack_problems(spec: JobSpec, report: dict) -> list[Problem]:
    """Problems of the stack a node reported: missing packages, versions older than requirements.txt's."""
    field, pins = field_to_fix(spec), tested_versions()
    where = f"on node {report.get('node') or '?'} ({report.get('python')})"
    fix = f"install requirements.txt's versions into that environment, or fix {field}"
    problems = []
    missing = report.get("missing") or {}
    if missing:
        said = "; ".join(f"{name} ({why})" for name, why in missing.items())
        problems.append(error(field, f"missing {', '.join(missing)} {where}: {said}: {fix}"))
    for name, have in (report.get("packages") or {}).items():
        pinned = pins.get(re.sub(r"[-_.]+", "-", name).lower())  # requirements.py's keys: PEP 503 names
        if pinned is None or _release(have) == _release(pinned):
            continue
        older = _release(have) < _release(pinned)
        said = f"{name} is {have} {where}, the bundle pins {pinned}"
        problems.append(error(field, f"{said}: {fix}") if older else warning(field, f"{said} (newer: untested)"))
    if "accelerate" in (report.get("packages") or {}) and not report.get("accelerate_command"):
        problems.append(error(field, f"the accelerate command is not on PATH {where}: put its bin folder on PATH"))
    if report.get("gpus") == 0:
        problems.append(
            error(field, f"torch sees no GPU {where}: install a CUDA build of torch there, or set launch.use_cpu=true")
        )
    return problems


def _release(version: str) -> tuple[int, ...]:
    """2.6.0+cu124 -> (2, 6, 0): the numbers that order versions (a local build tag is the same release)."""
    numbers = []
    for part in version.split("+")[0].split("."):
        digits = "".join(ch for ch in part if ch.isdigit()) if part[:1].isdigit() else ""
        if not digits:
            break
        numbers.append(int(digits))
        if not part.isdigit():
            break  # 1.0rc1: the release ends here
    return tuple(numbers)


def _tail(text: str, lines: int = 4) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:] if line.strip())[-600:]


def check_before_submit(
    spec: JobSpec, run_dir: Path, env: dict[str, str], folder: str | None = None, via: SshLink | None = None
) -> None:
    """Start's refusal when the run's nodes cannot run it (launch.slurm.preflight), naming the field to fix; the
    written run folder is then removed (here, and at `folder` on the login node when `via` is a link): nothing
    was submitted."""
    if not spec.launch.slurm.preflight:
        return
    problems, report = check_nodes(spec, folder or str(run_dir), env, via)
    errors = [p for p in problems if p.level == "error"]
    if errors:
        shutil.rmtree(run_dir, ignore_errors=True)
        if via is not None and folder:
            via.run(["rm", "-rf", "--", folder])
        raise refusal(errors, "the nodes cannot run the job")
    said = [{"field": p.field, "level": p.level, "message": p.message} for p in problems]
    (run_dir / NODES_FILE).write_text(json.dumps({"report": report, "problems": said}, indent=1) + "\n")
