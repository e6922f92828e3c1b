"""Predicted speed, time and cost per strategy (backend/estimate/speed.py), the advisor's use of it, and
calibration from finished runs (backend/runs/speed.py)."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import gradio as gr
import pytest

from estimate.gpu_runs import fake_gpu_run
from tunedeck.backend.estimate import speed
from tunedeck.backend.estimate.advisor import advise
from tunedeck.backend.estimate.memory_job import Job, input_values
from tunedeck.backend.runs.speed import calibration, compare_run
from tunedeck.backend.spec import set_paths, spec_to_yaml
from tunedeck.backend.spec.presets import resolve_spec as load_preset

TUNEDECK = str(Path(sys.executable).with_name("tunedeck"))
A100 = speed.Hardware.named("A100-80GB")


def estimate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [TUNEDECK, "estimate", *args], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120
    )


def test_estimate_json_has_time_and_throughput_for_every_strategy():
    result = estimate("7b-lora-ddp", "--json", "--cpu-mem", "512", "--price-per-gpu-hour", "2.5")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    for entry in [data["current"], *data["strategies"]]:
        assert entry["step_time_s"] > 0 and entry["tokens_per_s_per_gpu"] > 0, entry.get("strategy", "current")
        assert entry["hours"] > 0  # 9,846 guanaco rows x 1 epoch / global batch 32 = 308 steps
        assert entry["cost"] == pytest.approx(entry["hours"] * 2.5 * 4, rel=0.01)
    assert data["current"]["steps"] == 308
    assert data["speed"]["gpu"] == "A100-80GB" and data["speed"]["gpu_source"] == "assumed"  # no GPU here


def test_gpu_names_give_memory_and_peak_and_bad_input_names_the_flag():
    data = json.loads(estimate("7b-lora-ddp", "--json", "--gpu", "RTX 4090", "--cpu-mem", "512").stdout)
    assert data["gpu_mem_gb"] == 24 and data["speed"]["gpu"] == "RTX 4090"
    assert data["speed"]["interconnect"]["inside_machine"] == "pcie"  # a GeForce board has no NVLink
    h200 = json.loads(estimate("7b-lora-ddp", "--json", "--gpu", "H200", "--cpu-mem", "512").stdout)
    assert h200["current"]["tokens_per_s_per_gpu"] > 2.5 * data["current"]["tokens_per_s_per_gpu"]
    bad = estimate("7b-lora-ddp", "--gpu", "GTX 970")
    assert bad.returncode == 2 and "--gpu" in bad.stderr and "A100-80GB" in bad.stderr
    assert estimate("7b-lora-ddp", "--interconnect", "carrier-pigeon").returncode == 2


def _job(preset: str, **changes) -> tuple:
    spec = set_paths(load_preset(preset), changes)
    return spec, Job.from_values(input_values(spec))


def test_the_recommendation_changes_with_the_interconnect_and_says_why():
    """Full fine-tuning of 7B on 2 machines x 8 A100s: across InfiniBand every data-parallel option keeps up;
    across 100 Gb Ethernet only hybrid sharding does (weight gathers stay inside a machine). Two rows a micro
    batch: ZeRO-2's reduce-scatter of 7B's gradients (0.7 s over InfiniBand) hides behind the backward of
    4,096 tokens, not behind that of one row's 2,048 (0.4 s at the fitted A100 speed)."""
    spec = set_paths(load_preset("7b-full-zero2"), {"launch.num_machines": 2, "launch.num_processes": 16,
                                                     "training.gradient_accumulation_steps": 8,
                                                     "training.per_device_train_batch_size": 2})  # fmt: skip
    schedule = speed.schedule_of(spec, 10_000)
    advice = {}
    for link in ("infiniband", "ethernet"):
        hw = speed.Hardware.named("A100-80GB", link)
        advice[link] = advise(spec, 80, cpu_mem_gb=2000, hardware=hw, schedule=schedule).recommendation
    assert "HYBRID_SHARD" not in advice["infiniband"].strategy
    assert advice["ethernet"].strategy == "FSDP HYBRID_SHARD"
    # QLoRA + DDP is predicted faster still, but quantizing changes what is trained: never chosen for speed.
    assert all("method" not in a.changes for a in advice.values())
    assert "Ethernet, hybrid sharding keeps the weight gathers inside each machine" in advice["ethernet"].reason
    assert re.search(r"\d\.\d\dx the speed of |as fast as ", advice["ethernet"].reason)  # by how much


def test_fewer_machines_are_suggested_when_the_network_dominates():
    spec, job = _job("7b-full-zero2", **{"launch.num_machines": 4, "launch.num_processes": 16})
    prediction = speed.predict(job, speed.Hardware.named("A100-80GB", "ethernet"), speed.schedule_of(spec, 10_000))
    assert prediction.parts["communication"] > prediction.parts["compute"]
    assert "waits on the network between machines" in prediction.notes[0]


def test_zero3_moves_one_and_a_half_times_ddps_bytes():
    """ZeRO paper section 7: ZeRO-3 gathers weights twice and reduce-scatters gradients, 3 x Psi vs DDP's 2 x Psi."""
    _, ddp = _job("7b-full-zero2", **{"strategy.kind": "ddp", "model.dtype": "bfloat16"})
    _, zero3 = _job("7b-full-zero2", **{"strategy.kind": "zero3", "model.dtype": "bfloat16"})
    nothing_hidden = 0.0
    ddp_s, _ = speed._exposed_comms(ddp, A100, nothing_hidden, 1, ddp.trainable_params)
    zero3_s, _ = speed._exposed_comms(zero3, A100, nothing_hidden, 1, zero3.trainable_params)
    assert zero3_s / ddp_s == pytest.approx(1.5, rel=0.01)


def test_lora_ddp_gradients_hide_behind_the_backward_pass():
    spec, job = _job("7b-lora-ddp")
    prediction = speed.predict(job, A100, speed.schedule_of(spec, 1000))
    assert prediction.parts["communication"] == 0 and prediction.parts["offload"] == 0
    assert 0.2 < prediction.mfu < 0.6  # the published range (tests/data/measured_throughput.yaml)


def test_steps_from_max_steps_rows_or_unknown():
    spec = load_preset("7b-lora-ddp")  # global batch 2 x 4 x 4 = 32
    assert speed.schedule_of(spec, 3200).steps == 100
    assert speed.schedule_of(set_paths(spec, {"training.num_train_epochs": 2.5}), 3200).steps == 250
    assert speed.schedule_of(set_paths(spec, {"training.max_steps": 7}), 3200).steps == 7
    unknown = speed.schedule_of(set_paths(spec, {"dataset.path": "someone/unknown"}), None)
    assert unknown.steps is None and "training.max_steps" in unknown.steps_source
    _, job = _job("7b-lora-ddp")
    assert speed.predict(job, A100, unknown).hours is None


def test_time_outside_the_steps_is_modelled_not_one_constant():
    spec, job = _job("7b-lora-ddp", **{"dataset.eval_split": "train[95%:]", "training.eval_steps": 50})
    schedule = speed.schedule_of(spec, 4000)
    assert schedule.eval_rows == 200 and schedule.eval_passes == 2  # 125 steps, every 50
    lora = speed.predict(job, A100, schedule).around_s
    full_spec, full = _job("7b-full-zero2")
    full_around = speed.predict(full, A100, speed.schedule_of(full_spec, 4000)).around_s
    assert lora["eval"] > 0 and full_around["eval"] == 0
    assert full_around["checkpoints"] > 100 * lora["checkpoints"]  # weights and Adam states vs an adapter
    assert lora["load"] == pytest.approx(7.62e9 * 2 / 1.5e9, rel=0.01)  # Qwen2.5-7B's bf16 weights at READ_GBPS


def test_cpu_jobs_and_unknown_gpus_get_no_made_up_speed():
    spec, job = _job("7b-lora-ddp")
    assert speed.predict(job, speed.Hardware(gpu=None), speed.schedule_of(spec, 100)) is None
    _, cpu = _job("7b-lora-ddp", **{"launch.use_cpu": True})
    assert speed.predict(cpu, A100, speed.schedule_of(spec, 100)) is None


def test_dataset_rows_of_a_local_file(demo_home):
    spec = set_paths(load_preset("demo"), {})
    rows, source = speed.dataset_rows(spec)
    data = Path(spec.dataset.path)
    assert rows == len(data.read_text().splitlines()) and data.name in source
    for odd in ("/tmp/" + "x" * 300 + ".jsonl", "~no-such-user-here/data.jsonl", "/nonexistent/data.jsonl"):
        assert speed.dataset_rows(set_paths(spec, {"dataset.path": odd})) == (None, "")  # unknown, no traceback


# ---------------------------------------------------------------- calibration from finished runs


def test_finished_runs_compare_with_their_prediction_and_calibrate_the_next(tmp_path):
    spec, job = _job("7b-lora-ddp")
    predicted = speed.predict(job, A100, speed.schedule_of(spec, None)).tokens_per_s_per_gpu
    runs = tmp_path / "runs"
    fake_gpu_run(runs, "20260101-000000-aaaaaa", spec, predicted * 1.10, 20.0)
    fake_gpu_run(runs, "20260102-000000-bbbbbb", spec, predicted * 1.20, 20.0)
    fake_gpu_run(runs, "20260103-000000-cccccc", spec, predicted * 1.30, 20.0)
    comparison = compare_run(runs / "20260103-000000-cccccc")
    assert comparison.throughput_ratio == pytest.approx(1.30) and comparison.measured_peak_gb == 20.0
    found = calibration(runs, "A100-80GB")
    assert found.factor == pytest.approx(1.20) and len(found.runs) == 3
    assert found.sentence().startswith("your last 3 runs on A100-80GB were +20% vs prediction")
    assert calibration(runs, "H100") is None  # other GPUs' runs say nothing about this one
    assert comparison.startup_error is None and "step 1" not in found.sentence()  # no startup.json: not compared

    # Runs that say when their first step began compare the time to it with the modelled startup, load and scoring.
    around = speed.predict(job, A100, speed.schedule_of(spec, None)).around_s
    to_step1 = around["startup"] + around["load"]
    fake_gpu_run(runs, "20260104-000000-dddddd", spec, predicted * 1.20, 20.0, to_step1_s=to_step1 * 1.5)
    timed = compare_run(runs / "20260104-000000-dddddd")
    assert timed.measured_to_step1_s == pytest.approx(to_step1 * 1.5) and timed.startup_error == pytest.approx(0.5)
    assert re.search(r"; step 1 began \d+:\d\d after the launch vs \d+:\d\d predicted \(\+50%\)$", timed.line())
    assert calibration(runs, "A100-80GB").sentence().endswith(", +50% in the time to step 1")

    plain = json.loads(estimate("7b-lora-ddp", "--json", "--cpu-mem", "512", "--runs-dir", str(runs)).stdout)
    fixed = json.loads(
        estimate("7b-lora-ddp", "--json", "--cpu-mem", "512", "--runs-dir", str(runs), "--calibrate").stdout
    )
    assert plain["speed"]["your_runs"]["throughput_factor"] == pytest.approx(1.2, abs=0.001)
    assert not plain["speed"]["calibrated"] and fixed["speed"]["calibrated"]
    ratio = fixed["current"]["tokens_per_s_per_gpu"] / plain["current"]["tokens_per_s_per_gpu"]
    assert ratio == pytest.approx(1.2, rel=0.001)  # LoRA DDP is all compute: it speeds up by the whole factor
    text = estimate("7b-lora-ddp", "--cpu-mem", "512", "--runs-dir", str(runs)).stdout
    assert "your last 4 runs on A100-80GB were +20% vs prediction" in text and "--calibrate applies it" in text
    assert "+50% in the time to step 1" in text


def test_one_page_edit_scans_the_runs_folder_once_and_a_new_run_is_seen_after(tmp_path, monkeypatch):
    """The estimate uses the calibration twice per edit (the corrected speed, then the sentence under it):
    one scan of the runs folder serves both, carried on the JobResult; the next edit sees a run that finished since."""
    from tunedeck.app import estimate_panel
    from tunedeck.app.job_outputs import evaluate
    from tunedeck.app.registry import Registry
    from tunedeck.backend.machine.monitor import Monitor
    from tunedeck.backend.spec.fields import values_from_spec

    scans = []
    monkeypatch.setattr(estimate_panel, "calibration", lambda *a: scans.append(a) or calibration(*a))
    spec, _ = _job("7b-lora-ddp")
    panel = estimate_panel.EstimatePanel(Registry(), Monitor(), runs_dir=tmp_path)
    with gr.Blocks():
        panel.build_advice()
        panel.build_details()
    got = {panel.gpu: "A100-80GB", panel.ram: "512", panel.calibrate: True, panel.shown: estimate_panel.EstimateShown()}
    if hasattr(panel, "price"):  # the price box another change adds (app/estimate_panel.py); empty: no price
        got[panel.price] = ""

    def edit() -> str:
        result = evaluate(values_from_spec(spec), **panel.context(got))
        return panel.update(result, got)[panel.recommendation]

    assert "no finished GPU run on this GPU" in edit() and len(scans) == 1
    fake_gpu_run(tmp_path, "20260101-000000-aaaaaa", spec, 1000.0, 20.0)
    text = edit()
    assert (
        len(scans) == 2 and "Your last run on A100-80GB was -77% vs prediction" in text and "corrected by 0.23x" in text
    )


def test_the_network_your_runs_measured_between_machines_is_what_calibrate_predicts_with(tmp_path):
    """A run on 2 machines measured 2 GB/s between them (the estimate assumes HDR InfiniBand, 20 GB/s): its own
    prediction takes the measured network, so the throughput factor is left to compute, and --calibrate predicts
    the next job on several machines with the network measured."""
    two = {"launch.num_machines": 2, "launch.num_processes": 16}
    spec, job = _job("7b-full-zero2", **two)
    slow = dataclasses.replace(A100, measured_ring_gbps=2.0)
    schedule = speed.schedule_of(spec, None)
    assumed, measured = (speed.predict(job, hw, schedule).tokens_per_s_per_gpu for hw in (A100, slow))
    assert measured < assumed / 1.5  # full fine-tuning's gradients over a tenth of the assumed bandwidth
    runs = tmp_path / "runs"
    network = {"ranks": 16, "machines": 2, "all_ranks_gbps": 2.0}
    fake_gpu_run(runs, "20260101-000000-aaaaaa", spec, measured * 1.1, 60.0, world=16, network=network)
    comparison = compare_run(runs / "20260101-000000-aaaaaa")
    assert comparison.network_gbps == 2.0 and comparison.throughput_ratio == pytest.approx(1.1)
    found = calibration(runs, "A100-80GB")
    assert found.network_gbps == 2.0 and found.sentence().endswith("; they measured 2.0 GB/s between machines")
    one_machine = {"ranks": 8, "machines": 1, "all_ranks_gbps": 150.0}  # within a machine: not the link between
    fake_gpu_run(runs, "20260102-000000-bbbbbb", spec, assumed * 1.1, 60.0, world=16, network=one_machine)
    assert compare_run(runs / "20260102-000000-bbbbbb").throughput_ratio == pytest.approx(1.1)  # predicted as assumed
    assert calibration(runs, "A100-80GB").network_gbps == 2.0

    path = tmp_path / "job.yaml"
    path.write_text(spec_to_yaml(spec))
    args = (str(path), "--json", "--cpu-mem", "2000", "--gpu", "A100-80GB", "--runs-dir", str(runs))
    plain, fixed = (json.loads(estimate(*args, *more).stdout) for more in ((), ("--calibrate",)))
    assert fixed["speed"]["interconnect"]["measured_between_machines_gbps"] == 2.0
    assert plain["speed"]["interconnect"]["measured_between_machines_gbps"] is None
    # The network dominates this job: the compute factor (1.1) moves it a little, the measured network a lot.
    corrected = speed.predict(job, slow, schedule, correction=1.1).tokens_per_s_per_gpu
    assert fixed["current"]["tokens_per_s_per_gpu"] == pytest.approx(corrected, rel=0.01)
    assert plain["current"]["tokens_per_s_per_gpu"] == pytest.approx(assumed, rel=0.01)


def test_cpu_and_unfinished_runs_do_not_calibrate(tmp_path):
    spec, _ = _job("7b-lora-ddp")
    run_dir = fake_gpu_run(tmp_path, "20260101-000000-aaaaaa", spec, 1000.0, 20.0)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    (run_dir / "metrics.jsonl").write_text("\n".join(lines[:-1]) + "\n")  # still running: no end record
    assert compare_run(run_dir) is None
    start = json.loads(lines[0]) | {"gpu_name": None}
    (run_dir / "metrics.jsonl").write_text("\n".join([json.dumps(start), *lines[1:]]) + "\n")
    assert compare_run(run_dir) is None


def test_runs_show_prints_mfu_and_measured_vs_predicted(tmp_path):
    spec, job = _job("7b-lora-ddp")
    predicted = speed.predict(job, A100, speed.schedule_of(spec, None)).tokens_per_s_per_gpu
    run_dir = fake_gpu_run(tmp_path, "20260101-000000-aaaaaa", spec, predicted * 0.9, 20.0)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    logs = [json.dumps(json.loads(line) | {"mfu": 0.4, "hfu": 0.5}) if '"log"' in line else line for line in lines]
    (run_dir / "metrics.jsonl").write_text("\n".join(logs) + "\n")
    (run_dir / "status.json").write_text(json.dumps({"run_id": run_dir.name, "state": "finished", "exit_code": 0}))
    shown = subprocess.run(
        [TUNEDECK, "runs", "show", run_dir.name, "--runs-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "mfu      40.0% median (hfu 50.0%)" in shown.stdout, shown.stdout + shown.stderr
    assert re.search(
        r"speed    [\d,]+ tokens/s per GPU measured vs [\d,]+ predicted on A100-80GB \(-10%\)", shown.stdout
    )


# ---------------------------------------------------------------- the data: useful tokens, padding and packing


def _measured(spec, lengths: list[int]) -> dict:
    """The page's measurements ({measure_key: measurement}) of rows of these token lengths, as the preview gives."""
    from tunedeck.backend.data.truncation import measure_key

    return {
        measure_key(spec): {"format": spec.dataset.format, "lengths": lengths, "answer_starts": [None] * len(lengths)}
    }


def test_the_page_and_the_cli_count_the_padding_of_the_measured_rows(tmp_path):
    """Rows of 100 and 300 tokens in turn, batches of 4 padded to their longest: a third of what the GPU computes
    is padding. The speed counts the tokens trained; packed, the same rows have no padding and make fewer steps;
    unmeasured, the estimate says what it assumed."""
    from tunedeck.app.estimate_view import recommendation_markdown
    from tunedeck.app.job_outputs import evaluate
    from tunedeck.backend.spec.fields import values_from_spec

    padded = set_paths(load_preset("7b-lora-ddp"), {"dataset.packing": False, "training.group_by_length": False})
    packed = set_paths(padded, {"dataset.packing": True})
    lengths = [100, 300] * 1000
    speeds, texts = {}, {}
    for name, spec, measured in (("padded", padded, _measured(padded, lengths)),
                                 ("packed", packed, _measured(packed, lengths)), ("unmeasured", padded, None)):  # fmt: skip
        result = evaluate(values_from_spec(spec), "A100-80GB", "512", measured=measured)
        speeds[name], texts[name] = result.advice.current_speed, recommendation_markdown(result.advice)
    s = speeds["padded"]
    assert s.tokens_per_s_per_gpu == pytest.approx(s.processed_tokens_per_s_per_gpu * 2 / 3, rel=0.01)
    assert "tokens/s per GPU trained (33% of the tokens computed are padding: 2,000 rows previewed" in texts["padded"]
    p = speeds["packed"]
    assert p.tokens_per_s_per_gpu == pytest.approx(p.processed_tokens_per_s_per_gpu)  # padding-free packing
    assert p.tokens_per_s_per_gpu > 2 * s.tokens_per_s_per_gpu  # full 2,048-token sequences, no padding
    assert p.steps < s.steps / 4  # 2,000 rows of 200 tokens fill about 196 sequences of 2,048
    assert "no padding: 2,000 rows previewed: 200 tokens a row on average, packed 10.2 to a sequence" in texts["packed"]
    u = speeds["unmeasured"]
    assert u.data.assumed and u.tokens_per_s_per_gpu == u.processed_tokens_per_s_per_gpu
    assert "tokens/s per GPU trained (assumed: every row 2,048 tokens (dataset.max_seq_length)" in texts["unmeasured"]

    preview = tmp_path / "preview.json"
    from tunedeck.backend.data.preview import for_job

    preview.write_text(json.dumps(for_job(_measured(padded, lengths).popitem()[1], padded)))
    overrides = ["--set", "dataset.packing=false", "--set", "training.group_by_length=false", "--cpu-mem", "512"]
    cli = json.loads(estimate("7b-lora-ddp", *overrides, "--lengths", str(preview), "--json").stdout)
    assert cli["current"]["data"]["useful_share"] == pytest.approx(2 / 3, abs=0.005)
    assert cli["current"]["tokens_per_s_per_gpu"] == pytest.approx(s.tokens_per_s_per_gpu, rel=0.01)
    assert (
        "33% of the tokens computed are padding"
        in estimate("7b-lora-ddp", *overrides, "--lengths", str(preview)).stdout
    )
    plain = estimate("7b-lora-ddp", *overrides).stdout
    assert "TOK/S/GPU counts the tokens trained, not padding; assumed: every row 2,048 tokens" in plain
    bad = estimate("7b-lora-ddp", "--lengths", str(tmp_path / "none.json"))
    assert bad.returncode == 2 and "--lengths" in bad.stderr and "tunedeck preview SPEC --json" in bad.stderr


def test_a_short_micro_batch_waits_on_launches_not_on_flops():
    """One 128-token row a micro batch: a 1B model's step is not a seventh of a 7B's, as their FLOPs are: the GPU
    waits on the kernels each layer launches (LitGPT: phi-1.5 at one row takes 70% of Llama 2 7B's time). With 8
    rows of 2,048 tokens the FLOPs set the pace again."""
    ratios = {}
    for rows, length in ((1, 128), (8, 2048)):
        steps = {}
        for model in ("meta-llama/Llama-3.2-1B", "Qwen/Qwen2.5-7B-Instruct"):
            changes = {"model.name_or_path": model, "training.per_device_train_batch_size": rows}
            spec, job = _job("7b-lora-ddp", **changes, **{"dataset.max_seq_length": length})
            steps[model] = speed.predict(job, A100, speed.schedule_of(spec, None)).step_time_s
        ratios[rows] = steps["meta-llama/Llama-3.2-1B"] / steps["Qwen/Qwen2.5-7B-Instruct"]
    assert ratios[1] > 0.4 and ratios[8] < 0.25


def test_a_finished_run_is_compared_with_the_prediction_for_the_rows_it_trained(tmp_path):
    """A run whose logged token count says 400 tokens a sequence (short rows, packed padding-free or not) is compared
    with the prediction for such rows, not for rows of max_seq_length: their micro batches run below the peak."""
    from tunedeck.backend.estimate.speed_data import DataShape

    spec, job = _job("7b-lora-ddp")  # global batch 32, rows up to 2,048 tokens
    run_dir = fake_gpu_run(tmp_path, "20260101-000000-aaaaaa", spec, 1000.0, 20.0)
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for record in lines:
        if record["event"] == "log":
            record["num_tokens"] = record["step"] * 32 * 400  # TRL's count over every rank: 400 a sequence
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    short = dataclasses.replace(speed.schedule_of(spec, None), data=DataShape(400, 400, 400, 1.0, "400"))
    expected = speed.predict(job, A100, short).tokens_per_s_per_gpu
    full_rows = speed.predict(job, A100, speed.schedule_of(spec, None)).tokens_per_s_per_gpu
    assert compare_run(run_dir).predicted_tokens_per_s_per_gpu == pytest.approx(expected)
    assert expected < 0.95 * full_rows
