"""Everything Start refuses is in the page's problems before Start is pressed (issue 31, point 2).

The page showed "✓ No problems. The files on the right are exactly what Start runs" beside
"✗ Not started: ... does not exist": the checks of this machine ran only at Start. Each case
below is one refusal Start can give (RunManager.start: the job's rules, this machine's runs
folder and accelerate, resuming, the local inputs, where the job runs, its GPUs); for each,
Start refuses and the page's live evaluation of the same job (app/job_outputs.evaluate with
this machine) already shows that problem, in the same words.

The GPU inventory comes from NVML, which this machine lacks: for the cases with GPUs, Start's
NVML lookup is replaced and the page's monitor reads a stand-in NVML (tests/panel/fake_nvml.py);
everything else is real (files, sockets, PATH, the runs folder).
"""

from __future__ import annotations

import socket
import subprocess

import pytest
from panel.fake_nvml import FakeNvml

from tunedeck.app.job_outputs import ThisMachine, evaluate, issues_markdown
from tunedeck.backend.machine.monitor import Monitor
from tunedeck.backend.runs import preflight
from tunedeck.backend.runs.manager import RunError, RunManager
from tunedeck.backend.spec import load_presets
from tunedeck.backend.spec.fields import values_from_spec

from .helpers import fake_run

GPUS = [{"name": "NVIDIA A100-SXM4-80GB", "total_mb": 81920, "used_mb": 0, "util": 0, "temp": 30, "power_w": 60}] * 4
GPU_JOB = {"launch.use_cpu": False, "launch.gpu_ids": "0,1"}
TWO_MACHINES = {"launch.num_machines": 2, "launch.num_processes": 2}


def jsonl(path, *lines: str) -> str:
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["sleep", "120"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def port_in_use():
    with socket.socket() as holder:
        holder.bind(("", 0))
        holder.listen()
        yield holder.getsockname()[1]


def case(name: str, runs_dir, tmp_path, request, monkeypatch) -> tuple[dict, list[int]]:
    """(the job's overrides of the demo, this machine's GPUs) of one refusal; sets up what it needs."""
    if name == "the job's own rules":
        return {"strategy.kind": "fsdp", "strategy.fsdp_version": 1}, []  # FSDP1 cannot run on CPU
    if name == "missing model folder":
        return {"model.name_or_path": str(tmp_path / "models" / "mine")}, []
    if name == "model folder without config.json":
        (tmp_path / "empty-model").mkdir()
        return {"model.name_or_path": str(tmp_path / "empty-model")}, []
    if name == "missing data file":
        return {"dataset.path": str(tmp_path / "nowhere.jsonl")}, []
    if name == "data rows that do not parse":
        return {"dataset.path": jsonl(tmp_path / "bad.jsonl", '{"prompt": "Q", "completion": "A"', "{}")}, []
    if name == "missing mixed-in file":
        return {"dataset.mix": [str(tmp_path / "more.jsonl")]}, []
    if name == "resuming into a new, empty run folder":
        return {"training.resume_from_checkpoint": True}, []
    if name == "rendezvous host that does not resolve":
        return {**TWO_MACHINES, "launch.main_process_ip": "no-such-node.invalid"}, []
    if name == "rendezvous port in use":
        port = request.getfixturevalue("port_in_use")
        return {**TWO_MACHINES, "launch.main_process_ip": "127.0.0.1", "launch.main_process_port": port}, []
    if name == "no room for the checkpoints":  # a full fine-tune of 70B keeps terabytes of checkpoints
        model = load_presets()["70b-qlora-zero3"].build().model.name_or_path
        return {"model.name_or_path": model, "method": "full", "output_dir": str(tmp_path / "out")}, []
    if name == "Slurm without sbatch here":
        monkeypatch.setenv("PATH", "/nonexistent")
        return {"launch.backend": "slurm"}, []
    if name == "accelerate not installed":
        monkeypatch.setattr("tunedeck.backend.runs.launch.accelerate_command", lambda: None)
        monkeypatch.setattr("tunedeck.backend.runs.manager.accelerate_command", lambda: None)
        return {}, []
    if name == "runs folder that is a file":
        runs_dir.rmdir()
        runs_dir.write_text("")
        return {}, []
    if name == "GPU job, no GPU here":
        return GPU_JOB, []
    if name == "liger-kernel not installed":
        return {**GPU_JOB, "training.use_liger_kernel": True}, [0, 1, 2, 3]
    if name == "GPUs that are not here":
        return {**GPU_JOB, "launch.gpu_ids": "3,7"}, [0, 1, 2, 3]
    if name == "more processes than GPUs":
        return {**GPU_JOB, "launch.gpu_ids": "all", "launch.num_processes": 8}, [0, 1, 2, 3]
    if name == "GPUs held by a live run":
        fake_run(runs_dir, "20250101-120000-aaaaaa", "running", request.getfixturevalue("sleeper"), gpu_ids=[1, 2])
        return GPU_JOB, [0, 1, 2, 3]
    raise AssertionError(name)


REFUSALS = [
    "the job's own rules", "missing model folder", "model folder without config.json", "missing data file",
    "data rows that do not parse", "missing mixed-in file", "resuming into a new, empty run folder",
    "rendezvous host that does not resolve", "rendezvous port in use", "no room for the checkpoints",
    "Slurm without sbatch here", "accelerate not installed", "runs folder that is a file", "GPU job, no GPU here",
    "liger-kernel not installed", "GPUs that are not here", "more processes than GPUs", "GPUs held by a live run",
]  # fmt: skip


@pytest.mark.parametrize("name", REFUSALS)
def test_each_refusal_of_start_is_in_the_live_problems_first(name, demo_spec, runs_dir, tmp_path, request, monkeypatch):
    overrides, gpus = case(name, runs_dir, tmp_path, request, monkeypatch)
    spec = demo_spec(overrides)
    monkeypatch.setattr(preflight, "gpu_indices", lambda: list(gpus))
    here = ThisMachine(runs_dir, Monitor(history=1, nvml=FakeNvml(GPUS[: len(gpus)])))

    live = evaluate(values_from_spec(spec), here=here)  # what the page shows as the job is edited
    with pytest.raises(RunError) as refused:
        RunManager(runs_dir).start(spec)

    shown = issues_markdown(live)
    assert "No problems" not in shown, shown
    said = {(p.field, p.message) for p in live.issues}
    assert refused.value.problems, str(refused.value)  # every refusal is a list of problems, as the page's
    for problem in refused.value.problems:
        assert (problem.field, problem.message) in said, f"Start said {problem}; the page said:\n{shown}"


def test_a_missing_local_model_folder_is_an_error_by_its_label_before_start(demo_spec, runs_dir, tmp_path):
    spec = demo_spec({"model.name_or_path": str(tmp_path / "models" / "mine")})
    live = evaluate(values_from_spec(spec), here=ThisMachine(runs_dir, Monitor(history=1)))
    assert live.has_errors and "model.name_or_path" in live.error_fields  # Start and the download wait for it
    shown = issues_markdown(live)
    assert "[**Base model**](#field-model-name-or-path) (`model.name_or_path`): " in shown  # the label, the key
    assert f"{tmp_path / 'models' / 'mine'} does not exist: give the folder a model was saved to" in shown


def test_a_slurm_jobs_missing_paths_are_warnings_for_its_nodes(demo_spec, runs_dir, tmp_path):
    spec = demo_spec(
        {"launch.backend": "slurm", "model.name_or_path": "/cluster/models/mine", "dataset.path": "data/train.jsonl"}
    )
    live = evaluate(values_from_spec(spec), here=ThisMachine(runs_dir, Monitor(history=1)))
    found = {p.field: p for p in live.issues}
    assert not live.has_errors, issues_markdown(live)  # the bundle downloads; the paths are the nodes' business
    assert found["model.name_or_path"].level == "warning"
    assert found["model.name_or_path"].message == (
        "/cluster/models/mine does not exist on this machine; it must exist on the cluster's nodes "
        "(the same path on each, or storage they share)"
    )
    assert found["dataset.path"].message.endswith("(taken from the run's folder there)")


def test_a_gpu_job_without_a_gpu_here_warns_and_offers_the_bundle(runs_dir):
    spec = load_presets()["7b-lora-ddp"].build()
    live = evaluate(
        values_from_spec(spec), here=ThisMachine(runs_dir, Monitor(history=1))
    )  # the real NVML: no GPU here
    assert not live.has_errors  # the bundle downloads
    (gpu,) = [p for p in live.issues if p.field == preflight.MACHINE]
    assert gpu.level == "warning" and gpu.refused_here and live.start_refusals == [gpu]  # Start here refuses
    assert gpu.message.startswith("no NVIDIA GPU found here: download the bundle")
    assert "choose Demo (CPU)" in gpu.message
    assert "⚠ this machine: no NVIDIA GPU found here: download the bundle" in issues_markdown(live)


def test_the_checks_read_a_data_file_once_per_version(demo_spec, runs_dir, tmp_path, monkeypatch):
    """An edit costs stat calls: the first rows of the data are read again only when the file changes."""
    from tunedeck.backend.recipe import checks

    data = tmp_path / "data.jsonl"
    jsonl(data, '{"prompt": "Q", "completion": "A"}')
    reads = []
    real_rows = checks._rows
    monkeypatch.setattr(checks, "_rows", lambda path, limit: reads.append(path) or real_rows(path, limit))
    here = ThisMachine(runs_dir, Monitor(history=1))
    values = values_from_spec(demo_spec({"dataset.path": str(data)}))
    for rate in (1e-4, 2e-4, 3e-4):  # three edits of another field
        assert not evaluate({**values, "training.learning_rate": rate}, here=here).issues
    assert len(reads) == 1
    jsonl(data, '{"prompt": "Q", "completion": "A"}', "not json")  # the file changed: read again, and found wrong
    assert "dataset.path" in evaluate(values, here=here).error_fields and len(reads) == 2


def test_tunedeck_validate_says_the_same_for_this_machine(demo_spec, runs_dir, tmp_path, capsys, monkeypatch):
    from tunedeck.backend.cli import main

    monkeypatch.chdir(tmp_path)  # validate checks as `tunedeck train` would, from ./runs
    missing = str(tmp_path / "models" / "mine")
    for argv, code in (
        (["validate", "7b-lora-ddp"], 0),
        (["validate", "demo", "--set", f"model.name_or_path={missing}"], 2),
    ):
        assert main(argv) == code
        said = capsys.readouterr().err.splitlines()
        spec = load_presets()[argv[1]].build() if code == 0 else demo_spec({"model.name_or_path": missing})
        live = evaluate(values_from_spec(spec), here=ThisMachine(tmp_path / "runs", Monitor(history=1)))
        page = [f"{p.level}: {p.field}: {p.message}" for p in live.issues]
        assert page and page == [line for line in said if line.startswith(("error: ", "warning: "))], said
