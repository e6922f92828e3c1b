"""Real training runs: `accelerate launch` subprocesses with several ranks on CPU (gloo).

Each test checks the start record, what the run actually got, not only the exit
code: several launch modes exit 0 while running one process (docs/notes/cpu-distributed.md).
Steps are kept few; a distributed case costs ~15 s on 2 cores.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tunedeck.backend.runs.manager import RunManager
from tunedeck.backend.runs.startup import read_phases

from .helpers import end_record, log_records, logs_tail, read_metrics, start_record, tunedeck

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

BIN = Path(sys.executable).parent


def run_to_end(runs_dir, spec, timeout: float = 300):
    manager = RunManager(runs_dir)
    run_id = manager.start(spec)
    status = manager.wait(run_id, timeout=timeout)
    return manager, run_id, status


def assert_finished(manager, run_id, status):
    run_dir = manager.run_dir(run_id)
    assert status.state == "finished", f"{status}\n{logs_tail(run_dir)}"
    assert status.exit_code == 0
    assert end_record(run_dir)["status"] == "finished"


def test_tunedeck_train_demo_as_a_new_user_runs_it(tmp_path):
    """The README's `tunedeck train demo`: 2 ranks of DDP over gloo, under 90 s, loss at least halved; in its first
    60 steps (the preset trains 600, a minute to watch, which the suite cannot spend)."""
    runs_dir = tmp_path / "runs"
    began = time.monotonic()
    result = subprocess.run(
        [str(BIN / "tunedeck"), "train", "demo", "--runs-dir", str(runs_dir), "--set", "training.max_steps=60"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=300,
    )
    wall = time.monotonic() - began
    assert result.returncode == 0, result.stdout + result.stderr
    # What the run got: the same facts line as `runs show` and the panel (backend/runs/summary.py)
    facts = r"^2 ranks · DDP · [\d.]+% of parameters trainable \([\d,]+ of [\d,]+\) · lora · DistributedDataParallel$"
    assert re.search(facts, result.stdout, re.M), result.stdout
    assert "step 60/60" in result.stdout and "finished in" in result.stdout
    (run_dir,) = [p for p in runs_dir.iterdir() if p.is_dir()]
    start = start_record(run_dir)
    assert start["world_size"] == 2 and start["backend"] == "gloo"
    assert start["model_class"] == "DistributedDataParallel" and start["zero_stage"] is None and not start["fsdp"]
    assert 0 < start["trainable_params"] < start["total_params"]
    # On CPU there is no peak to measure against: the run says so, and logs no made-up MFU.
    assert start["peak_tflops"] is None and start["mfu_note"].startswith("MFU is not defined without a known peak")
    assert not any("mfu" in r for r in log_records(run_dir))
    losses = [r["loss"] for r in log_records(run_dir)]
    assert [r["step"] for r in log_records(run_dir)] == list(range(1, 61))
    assert losses[-1] <= losses[0] / 2, losses
    assert wall < 90, f"the demo took {wall:.0f} s"
    assert (run_dir / "output" / "adapter_model.safetensors").is_file()
    assert (run_dir / "logs" / "rank0.log").is_file() and (run_dir / "logs" / "rank1.log").is_file()

    listing = subprocess.run(
        [str(BIN / "tunedeck"), "runs", "--runs-dir", str(runs_dir)], capture_output=True, text=True
    )
    assert run_dir.name in listing.stdout and "finished" in listing.stdout and "60/60" in listing.stdout
    show = subprocess.run(
        [str(BIN / "tunedeck"), "runs", "show", run_dir.name, "--runs-dir", str(runs_dir)],
        capture_output=True,
        text=True,
    )
    assert "state    finished (exit code 0)" in show.stdout and "2 ranks" in show.stdout
    # Before step 1 the run said what it was doing, in order, and `runs show` says how long each part took.
    said = [line.removesuffix(" ...") for line in result.stdout.splitlines() if line.endswith(" ...")]
    before = ["importing the libraries", "joining the other processes", "loading the model", "loading the data",
              "tokenizing the data", "preparing the model and optimizer", "the first step"]  # fmt: skip
    assert said == before, result.stdout
    phases = read_phases(run_dir)
    assert [p for p, _ in phases] == [*before, "training"]
    assert [t for _, t in phases] == sorted(t for _, t in phases)
    assert phases[-1][1] <= log_records(run_dir)[0]["time"]  # training began before the first step was logged
    startup = re.search(r"^startup  (\d+:\d\d) \((.*)\) before step 1$", show.stdout, re.M)
    assert startup and [part.rsplit(" ", 1)[0] for part in startup.group(2).split(", ")] == before, show.stdout


# The demo with LoRA on DeepSpeed ZeRO-2 and ZeRO-3, with MFU against a stand-in peak: test_resume_shape.py's chains
# (their first runs assert deepspeed_run_and_mfu; their last ones finish and save the adapter).


# On 2 DDP ranks: the after-training tests' QLoRA run, which test_merge.py's QLoRA test checks the same way.
@pytest.mark.parametrize("processes", [1])
def test_qlora_4bit(processes, runs_dir, demo_spec):
    spec = demo_spec(
        {
            "method": "qlora",
            "quantization.bits": 4,
            "quantization.bnb_4bit_compute_dtype": "float32",
            "launch.num_processes": processes,
            "training.max_steps": 3,
        }
    )
    manager, run_id, status = run_to_end(runs_dir, spec)
    assert_finished(manager, run_id, status)
    start = start_record(manager.run_dir(run_id))
    assert start["world_size"] == processes and start["method"] == "qlora"
    assert start["quantized_modules"].get("Linear4bit", 0) >= 7  # the base's linear layers really are 4-bit
    assert start["model_class"] == ("DistributedDataParallel" if processes == 2 else "PeftModelForCausalLM")
    assert 0 < start["trainable_params"] < start["total_params"]


def test_neftune_noise_and_rslora_reach_the_model(runs_dir, demo_spec):
    """NEFTune's hook sits on the input embeddings with the asked alpha, and PEFT scales the adapters by
    lora_alpha / sqrt(r): the start record reads both off the live model, and the gate compares them with the job."""
    spec = demo_spec({"training.neftune_noise_alpha": 5.0, "lora.use_rslora": True, "training.max_steps": 6})
    manager, run_id, status = run_to_end(runs_dir, spec)
    assert_finished(manager, run_id, status)
    start = start_record(manager.run_dir(run_id))
    assert start["gate"]["passed"] and start["neftune_noise_alpha"] == 5.0
    assert start["lora_scaling"] == pytest.approx(spec.lora.lora_alpha / spec.lora.r**0.5)
    assert spec.lora.lora_alpha / spec.lora.r != pytest.approx(start["lora_scaling"])  # plain LoRA's would differ
    losses = [r["loss"] for r in log_records(manager.run_dir(run_id))]
    assert losses[-1] < losses[0], losses


def test_messages_dataset_with_evaluation_and_the_general_text_check_on_zero3(runs_dir, demo_spec, demo_home):
    from tunedeck.backend.after.evaluate import evaluate_run

    spec = demo_spec(
        {
            "dataset.path": str(demo_home / "formats" / "messages.jsonl"),
            "dataset.format": "messages",
            "dataset.split": "train[:90%]",
            "dataset.eval_split": "train[90%:]",
            "dataset.general_text": "built-in",
            "training.eval_steps": 2,
            "training.max_steps": 4,
            "strategy.kind": "zero3",
        }
    )
    manager, run_id, status = run_to_end(runs_dir, spec)
    assert_finished(manager, run_id, status)
    run_dir = manager.run_dir(run_id)
    start = start_record(run_dir)
    assert (start["world_size"], start["distributed_type"], start["zero_stage"]) == (2, "DEEPSPEED", 3)
    assert [r["step"] for r in log_records(run_dir)] == [1, 2, 3, 4]
    evaluated = [r for r in read_metrics(run_dir) if r["event"] == "log" and "eval_loss" in r]
    # Before the first step too (the model as it started), then every 2 steps: the held-out rows and the general text.
    assert [r["step"] for r in evaluated] == [0, 2, 4]
    assert all(r["eval_loss"] > 0 and r["eval_general_text_loss"] > 0 for r in evaluated)
    # The sample is scored as the forgetting check after training scores it: before the first step the adapters do
    # nothing, so the ranks' loss on it is the base model's, as Evaluate measures it in one process.
    base = evaluate_run(run_dir, manager.job(run_id), ["base"], "cpu", limit=2, general_text="built-in")
    measured = base["results"]["base"]["general_text"]
    assert evaluated[0]["eval_general_text_loss"] == pytest.approx(measured["loss"], rel=1e-3)
    shown = tunedeck("runs", "show", run_id, "--runs-dir", runs_dir).stdout  # the summary compares the two ends
    first, last = evaluated[0]["eval_general_text_loss"], evaluated[-1]["eval_general_text_loss"]
    assert f" · general text {first:.3f} → {last:.3f} (" in shown, shown


def test_resume_continues_the_step_count(runs_dir, demo_spec, tmp_path):
    output = tmp_path / "shared-output"
    first = demo_spec(
        {"output_dir": str(output), "training.max_steps": 4, "training.save_steps": 2, "launch.num_processes": 1}
    )
    manager, run_id, status = run_to_end(runs_dir, first)
    assert_finished(manager, run_id, status)
    assert (output / "checkpoint-4" / "trainer_state.json").is_file()

    second = demo_spec(
        {
            "output_dir": str(output),
            "training.max_steps": 6,
            "training.save_steps": 2,
            "training.resume_from_checkpoint": True,
            "launch.num_processes": 1,
        }
    )
    manager, run_id, status = run_to_end(runs_dir, second)
    assert_finished(manager, run_id, status)
    run_dir = manager.run_dir(run_id)
    assert start_record(run_dir)["resumed_from_step"] == 4
    assert [r["step"] for r in log_records(run_dir)] == [5, 6]
    assert (output / "checkpoint-6").is_dir()
