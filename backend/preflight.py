"""Checks before a launch: what this machine can tell about a job before any process starts.

- The job's local model folder and data file: a path that does not exist, a model folder
  without config.json, a data file whose first rows do not parse or do not fit
  dataset.format. These are train.py's own checks (it runs them again at start, for bundles
  run without tunedeck), so the pre-launch check and the run say the same words.
- The GPUs it asks for exist here and no live run holds them.
- Resuming has an output folder to resume from.

`tunedeck validate` shows the first kind as problems; RunManager.start refuses on any of them,
before a run folder exists.
"""

from __future__ import annotations

from pathlib import Path

from tunedeck.backend import train
from tunedeck.backend.run_folder import ACTIVE_STATES
from tunedeck.backend.runs import RunError, RunStatus
from tunedeck.backend.validate import Problem

RUN_FOLDER = "<run-id>"  # relative paths in a job are taken from its run folder (train.py works there)


def preflight(spec, runs_dir: Path) -> list[Problem]:
    """Problems of the job's local model and data, checked from where its run will work."""
    from tunedeck.backend.demo import is_built
    from tunedeck.backend.spec import demo_home, spec_to_dict

    job = spec_to_dict(spec)
    home = str(demo_home())
    if not is_built(Path(home)):
        # The demo's model and data are built when a run needs them (RunManager.start): nothing to check yet.
        for section, key in (("model", "name_or_path"), ("dataset", "path")):
            if str(job[section][key]).startswith(home):
                job[section] = {}
    from tunedeck.backend.preflight_launch import launch_problems

    return [
        Problem("error", field, message) for field, message in train.input_problems(job, Path(runs_dir) / RUN_FOLDER)
    ] + launch_problems(spec, Path(runs_dir), Path(runs_dir) / RUN_FOLDER)


def job_problems(spec, runs_dir: Path) -> list[Problem]:
    """A job's problems before it starts: its rules, then, when they hold, what this machine tells (preflight).
    What `tunedeck train` and `tunedeck sweep` check before they start or queue anything."""
    from tunedeck.backend.validate import validate

    problems = validate(spec)
    if not any(p.level == "error" for p in problems):
        problems += preflight(spec, runs_dir)
    return problems


def gpu_indices() -> list[int]:
    """Indices of this machine's NVIDIA GPUs (NVML), or [] without a GPU or driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - pynvml.NVMLError and ImportError alike: no usable GPU
        return []
    try:
        return list(range(pynvml.nvmlDeviceGetCount()))
    finally:
        pynvml.nvmlShutdown()


def claim_gpus(spec, runs: list[RunStatus], ahead: list[RunStatus] = ()) -> list[int] | None:
    """The GPUs the run will use; refuses GPUs that a live run holds, unless it is queued after that run
    (`ahead`). None for CPU runs."""
    if spec.launch.use_cpu:
        return None
    wanted = wanted_gpus(spec)
    waited = {run.run_id for run in ahead}
    for other in runs:
        clash = sorted(set(other.gpu_ids or []) & set(wanted)) if other.state in ACTIVE_STATES else []
        if clash and other.run_id not in waited:
            names = f"GPU {clash[0]} is" if len(clash) == 1 else f"GPUs {', '.join(map(str, clash))} are"
            raise RunError(
                f"{names} in use by run {other.run_id} ({other.title}): stop it, set launch.gpu_ids to free GPUs, "
                "or queue this run after it (Queue in the panel, tunedeck train --queue)"
            )
    return wanted


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
    launch = spec.launch
    available = gpu_indices()
    if not available:
        raise RunError(
            "no NVIDIA GPU found on this machine: set launch.use_cpu to true to train on CPU processes "
            "(gloo), as the demo preset does"
        )
    wanted = available if launch.gpu_ids == "all" else [int(i) for i in launch.gpu_ids.split(",") if i]
    missing = [i for i in wanted if i not in available]
    if missing:
        names = f"GPU {missing[0]} does" if len(missing) == 1 else f"GPUs {', '.join(map(str, missing))} do"
        raise RunError(
            f"launch.gpu_ids: {names} not exist here; this machine has GPUs {', '.join(map(str, available))}"
        )
    wanted = wanted[: launch.processes_per_machine]
    if len(wanted) < launch.processes_per_machine:
        raise RunError(
            f"launch.num_processes: {launch.processes_per_machine} processes need as many GPUs, and only "
            f"{len(wanted)} are available: lower launch.num_processes"
        )
    return wanted


def check_resume(spec, runs_dir: Path, runs: list[RunStatus]) -> None:
    """Resuming needs an output folder that outlives a run: a relative one is inside the new, empty run folder."""
    if not spec.training.resume_from_checkpoint or Path(spec.output_dir).expanduser().is_absolute():
        return
    example = next(
        (
            runs_dir / run.run_id / spec.output_dir
            for run in runs
            if any((runs_dir / run.run_id / spec.output_dir).glob("checkpoint-*"))
        ),
        None,
    )
    raise RunError(
        f"training.resume_from_checkpoint: output_dir {spec.output_dir!r} is relative to the new run's own "
        "folder, which has no checkpoint to continue from, so the run would start again at step 0; set "
        "output_dir to the absolute path of the output folder of the run to continue"
        + (f", e.g. {example} (the newest run with checkpoints)" if example else "")
    )
