"""Checks before a launch: what this machine can tell about a job before any process starts.

Everything Start refuses on beyond the job's own rules (backend/validate/__init__.py), as problems in one
list, so that the page shows them while the job is edited (app/job_outputs.py), `tunedeck
validate` prints them, and Start refuses in the same words:

- the job's local model, data and reward files (backend/runs/preflight_inputs.py: train.py's own checks);
- where it runs (backend/runs/preflight_launch.py): the rendezvous, room for the checkpoints, Slurm;
- resuming has an output folder to resume from;
- a GPU job: GPUs here, the ones it names, as many as its processes, none held by a live run.
  These are warnings, since the bundle still runs on a machine that has them; Start here
  refuses on them (Problem.refused_here; claim_gpus), in the same words.

Where the job runs (`where_it_runs`) decides what a path missing here means: an error for a job
of this machine, a warning for one bound for other machines (a Slurm job; a GPU job on a
machine without a GPU, which only its bundle can run), since the path must exist there.
RunManager.start refuses on the errors, before a run folder exists.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from tunedeck.backend.machine.nvml import gpu_indices  # a name of this module too: tests stand in for it
from tunedeck.backend.runs.folder import ACTIVE_STATES, RUN_ID_PATTERN
from tunedeck.backend.runs.preflight_inputs import input_problems
from tunedeck.backend.runs.preflight_launch import launch_problems
from tunedeck.backend.runs.status import RunError, RunStatus
from tunedeck.backend.spec.problem import Problem, error, refused_here

RUN_FOLDER = "<run-id>"  # relative paths in a job are taken from its run folder (train.py works there)
CLUSTER = "the cluster's nodes (the same path on each, or storage they share)"
GPU_MACHINE = "the GPU machine that runs the bundle"
MACHINE = "this machine"  # the field of a problem of the machine rather than of a field of the job
NO_GPU = (
    "no NVIDIA GPU found here: download the bundle (⬇ Download bundle, or tunedeck export) and run it on a GPU "
    "machine, or choose Demo (CPU); a small model can also train on CPU processes (launch.use_cpu=true)"
)


def where_it_runs(spec, gpus: list[int]) -> str | None:
    """None for a job this machine runs; else the machines it runs on, in words: a Slurm job's nodes, or, for a
    GPU job here without a GPU, the machine its bundle goes to."""
    if spec.launch.backend == "slurm":
        return CLUSTER
    if not spec.launch.use_cpu and not gpus:
        return GPU_MACHINE
    return None


def needs_gpus_here(spec) -> bool:
    return spec.launch.backend == "local" and not spec.launch.use_cpu


def preflight(
    spec, runs_dir: Path, gpus: list[int] | None = None, runs: list[RunStatus] | None = None
) -> list[Problem]:
    """What this machine tells about the job, checked from where its run will work (runs_dir/<run-id>).

    `gpus`: this machine's GPU indices (None: asked of NVML when the job needs GPUs here); `runs`: the runs of
    runs_dir, for the GPUs live runs hold (None: not checked)."""
    from tunedeck.backend.data.demo import is_built
    from tunedeck.backend.spec import demo_home, spec_to_dict

    job = spec_to_dict(spec)
    home = str(demo_home())
    if not is_built(Path(home)):
        # The demo's model and data are built when a run needs them (RunManager.start): nothing to check yet.
        for section, key in (("model", "name_or_path"), ("dataset", "path")):
            if str(job[section][key]).startswith(home):
                job[section] = {}
    if gpus is None and needs_gpus_here(spec):
        gpus = gpu_indices()
    elsewhere = where_it_runs(spec, gpus or [])
    run_folder = Path(runs_dir) / RUN_FOLDER
    problems = input_problems(job, run_folder, elsewhere)
    if elsewhere != GPU_MACHINE:  # the bundle's machine is not this one: its ports, disks and names are its own
        problems += launch_problems(spec, Path(runs_dir), run_folder)
    problems += resume_problems(spec, Path(runs_dir))
    problems += machine_problems(Path(runs_dir))
    if needs_gpus_here(spec):
        problems += gpu_problems(spec, gpus or [], runs or [])
    return problems


def job_problems(spec, runs_dir: Path) -> list[Problem]:
    """A job's problems before it starts: its rules, then, when they hold, what this machine tells (preflight).
    What `tunedeck train` and `tunedeck sweep` check before they start or queue anything."""
    from tunedeck.backend.validate import validate

    problems = validate(spec)
    if not any(p.level == "error" for p in problems):
        problems += preflight(spec, runs_dir)
    return problems


def refusal(problems: list[Problem], head: str | None = None) -> RunError:
    """Start's refusal of `problems`: a RunError whose text names each field by its key (the CLI's words); the
    page names them by their labels, from its `problems` and `head` (app/errors.py)."""
    refused = RunError(refusal_text(problems, head))
    refused.problems, refused.head = list(problems), head
    return refused


def refusal_text(problems: list[Problem], head: str | None, named: Callable[[str], str] = str) -> str:
    """One problem as "field: message", several as a list under `head`; `named` names a field (by its key)."""
    lines = [f"{named(p.field)}: {p.message}" if p.field else p.message for p in problems]
    return lines[0] if len(lines) == 1 else f"{head or 'refused'}:\n" + "\n".join(f"- {line}" for line in lines)


def machine_problems(runs_dir: Path) -> list[Problem]:
    """What keeps this machine from starting any run: the runs folder is a file, accelerate is not installed.
    Warnings: the job's bundle runs where they are fine; Start here refuses."""
    from tunedeck.backend.runs.launch import accelerate_command

    problems = []
    if Path(runs_dir).exists() and not Path(runs_dir).is_dir():
        problems.append(
            refused_here("--runs-dir", f"{runs_dir} is a file, not a folder: give a folder (it is created if missing)")
        )
    if accelerate_command() is None:
        problems.append(
            refused_here(
                MACHINE,
                f"the accelerate command is not installed next to {sys.executable}: install the training stack "
                "(pip install 'tunedeck[train]')",
            )
        )
    return problems


# ---------------------------------------------------------------- GPUs


def gpu_problems(
    spec, available: list[int], runs: Iterable[RunStatus] = (), ahead: Iterable[RunStatus] = ()
) -> list[Problem]:
    """Why a GPU job cannot have its GPUs here: none here, named ones missing, too few, or held by a live run that
    it is not queued after (`ahead`). Warnings: the bundle runs where the GPUs are; Start here refuses."""
    launch = spec.launch
    if not available:
        return [refused_here(MACHINE, NO_GPU)]
    wanted = available if launch.gpu_ids == "all" else [int(i) for i in launch.gpu_ids.split(",") if i]
    missing = [i for i in wanted if i not in available]
    if missing:
        names = f"GPU {missing[0]} does" if len(missing) == 1 else f"GPUs {', '.join(map(str, missing))} do"
        return [
            refused_here(
                "launch.gpu_ids",
                f"{names} not exist here; this machine has GPUs {', '.join(map(str, available))}",
            )
        ]
    wanted = wanted[: launch.processes_per_machine]
    if len(wanted) < launch.processes_per_machine:
        return [
            refused_here(
                "launch.num_processes",
                f"{launch.processes_per_machine} processes need as many GPUs, and only {len(wanted)} are available: "
                "lower launch.num_processes",
            )
        ]
    waited = {run.run_id for run in ahead}
    for other in runs:
        clash = sorted(set(other.gpu_ids or []) & set(wanted)) if other.state in ACTIVE_STATES else []
        if clash and other.run_id not in waited:
            names = f"GPU {clash[0]} is" if len(clash) == 1 else f"GPUs {', '.join(map(str, clash))} are"
            return [
                refused_here(
                    "launch.gpu_ids",
                    f"{names} in use by run {other.run_id} ({other.title}): stop it, set launch.gpu_ids to free GPUs, "
                    "or queue this run after it (Queue in the panel, tunedeck train --queue)",
                )
            ]
    return []


def claim_gpus(spec, runs: list[RunStatus], ahead: Sequence[RunStatus] = ()) -> list[int] | None:
    """The GPUs the run will use; refuses GPUs that a live run holds, unless it is queued after that run
    (`ahead`). None for CPU runs."""
    if spec.launch.use_cpu:
        return None
    available = gpu_indices()
    problems = gpu_problems(spec, available, runs, ahead)
    if problems:
        raise refusal(problems)
    return _wanted(spec, available)


def runs_ahead(spec, runs: list[RunStatus]) -> list[RunStatus]:
    """The live runs of this machine that a run queued now starts after: those holding a GPU it wants; for a CPU
    run, the other CPU runs (they would share the cores)."""
    here = [run for run in runs if run.state in ACTIVE_STATES and run.backend == "local"]
    if spec.launch.use_cpu:
        return [run for run in here if run.gpu_ids is None]
    wanted = set(wanted_gpus(spec))
    return [run for run in here if wanted & set(run.gpu_ids or [])]


def wanted_gpus(spec) -> list[int]:
    """The GPUs of this machine that a GPU run asks for (launch.gpu_ids, as many as its processes)."""
    available = gpu_indices()
    problems = gpu_problems(spec, available)
    if problems:
        raise refusal(problems)
    return _wanted(spec, available)


def _wanted(spec, available: list[int]) -> list[int]:
    launch = spec.launch
    wanted = available if launch.gpu_ids == "all" else [int(i) for i in launch.gpu_ids.split(",") if i]
    return wanted[: launch.processes_per_machine]


# ---------------------------------------------------------------- resuming


def resume_problems(spec, runs_dir: Path) -> list[Problem]:
    """Resuming needs an output folder that outlives a run: a relative one is inside the new, empty run folder."""
    if not spec.training.resume_from_checkpoint or Path(spec.output_dir).expanduser().is_absolute():
        return []
    try:  # the newest run with checkpoints in that output folder, as an example
        folders = sorted((p for p in Path(runs_dir).iterdir() if RUN_ID_PATTERN.match(p.name)), reverse=True)
    except OSError:
        folders = []
    example = next((f / spec.output_dir for f in folders if any((f / spec.output_dir).glob("checkpoint-*"))), None)
    return [
        error(
            "training.resume_from_checkpoint",
            f"output_dir {spec.output_dir!r} is relative to the new run's own folder, which has no checkpoint to "
            "continue from, so the run would start again at step 0; set output_dir to the absolute path of the "
            "output folder of the run to continue"
            + (f", e.g. {example} (the newest run with checkpoints)" if example else ""),
        )
    ]


def check_resume(spec, runs_dir: Path, runs: Sequence[RunStatus] = ()) -> None:
    """RunError when resuming has nothing to resume from (resume_problems)."""
    problems = resume_problems(spec, runs_dir)
    if problems:
        raise refusal(problems)
