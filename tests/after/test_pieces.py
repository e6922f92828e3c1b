"""The light pieces: prompts and settings, device placement, eval.json, serve.sh, push and CLI errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from panel.fake_nvml import FakeNvml
from runs.helpers import fake_run

from tunedeck.backend import recipe
from tunedeck.backend.after.eval_results import read_eval, save_results, table_rows
from tunedeck.backend.after.prompting import (
    GenerationSettings,
    SettingsError,
    StopTrimmer,
    resolve_template,
    wrap_plain,
)
from tunedeck.backend.after.worker_device import inference_gb, place
from tunedeck.backend.render.serve import render_serve_sh, vllm_max_lora_rank
from tunedeck.backend.spec import JobSpec, load_presets, set_paths, spec_to_dict

from .helpers import tunedeck

RUN_ID = "20250101-120000-abcdef"


# ---------------------------------------------------------------- prompts and settings


def test_stop_strings_end_the_stream_even_across_pieces():
    trimmer = StopTrimmer(["\nQ:"])
    shown = [trimmer.feed(piece) for piece in [" 7", "\n", "Q", ": next"]]
    assert "".join(shown) == " 7" and trimmer.stopped and trimmer.text == " 7"
    plain = StopTrimmer([])
    assert [plain.feed(p) for p in ["a", "b"]] == ["a", "b"] and plain.flush() == ""


@pytest.mark.parametrize(
    "values, field",
    [({"max_new_tokens": 0}, "max_new_tokens"), ({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"),
     ({"repetition_penalty": 0}, "repetition_penalty"), ({"stop": [""]}, "stop"), ({"temperature": "hot"}, "generation settings")],
)  # fmt: skip
def test_bad_generation_settings_name_the_setting(values, field):
    with pytest.raises(SettingsError, match=f"^{field}"):
        GenerationSettings.from_dict(values)


def test_templates_follow_the_runs_dataset_format():
    assert resolve_template("auto", "messages", True) == "chat"
    assert resolve_template("auto", "alpaca", True) == "alpaca"
    assert resolve_template("auto", "prompt-completion", True) == "plain"
    with pytest.raises(SettingsError, match="no chat template"):
        resolve_template("chat", "text", False)


def test_alpaca_prompt_is_the_one_the_run_trained_on():
    from datasets import Dataset

    trained = recipe.to_trl_format(
        Dataset.from_list([{"instruction": " Add 2 and 3. ", "output": "5"}]), {"format": "alpaca"}, "text"
    )
    assert wrap_plain("alpaca", "Add 2 and 3.") == trained[0]["prompt"]


# ---------------------------------------------------------------- where the model runs


def preset_job(preset: str) -> JobSpec:
    return load_presets()[preset].build()


def gpus(*free_gb) -> FakeNvml:
    return FakeNvml(
        [
            {
                "name": "NVIDIA H100 80GB HBM3",
                "total_mb": 81559,
                "used_mb": 81559 - gb * 1024,
                "util": 0,
                "temp": 40,
                "power_w": 70,
            }
            for gb in free_gb
        ]
    )


def test_inference_estimates_are_in_the_right_range():
    assert 35 < inference_gb(preset_job("70b-qlora-zero3")) < 60  # 70B in 4 bits: ~35 GB of weights
    assert 13.5 < inference_gb(preset_job("7b-lora-ddp")) < 20  # 7B in bf16: 13.5 GB of weights, fits a 24 GB card
    # Evaluation scores 8 full-length sequences at once: their KV cache and logits count too.
    assert inference_gb(preset_job("7b-lora-ddp"), batch=8) > inference_gb(preset_job("7b-lora-ddp")) + 8
    assert inference_gb(set_paths(JobSpec(), {"model.name_or_path": "nobody/unknown-model"})) is None


def test_a_gpu_that_a_live_run_holds_is_skipped(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # the live run's supervisor
    try:
        fake_run(tmp_path, RUN_ID, "running", holder, gpu_ids=[0])
        chosen = place(preset_job("7b-lora-ddp"), tmp_path, nvml=gpus(79, 40))
        assert (chosen.device, chosen.gpu, chosen.warning) == ("cuda:0", 1, None)
        # Neither GPU: one held, the other serving another model -> CPU, saying why.
        chosen = place(preset_job("7b-lora-ddp"), tmp_path, taken={1}, nvml=gpus(79, 40))
        assert chosen.device == "cpu" and chosen.gpu is None
        assert f"GPU 0 is held by run {RUN_ID}" in chosen.warning and "GPU 1 serves another model" in chosen.warning
    finally:
        holder.kill()
        holder.wait()


def test_a_model_too_big_for_the_free_memory_runs_on_the_cpu_with_a_warning(tmp_path):
    chosen = place(preset_job("70b-qlora-zero3"), tmp_path, nvml=gpus(20.0))
    assert chosen.device == "cpu" and "GPU 0 has 20.0 GiB free" in chosen.warning and "needs about" in chosen.warning
    assert place(preset_job("70b-qlora-zero3"), tmp_path, nvml=gpus(20.0, 79.0)).gpu == 1


def test_without_a_gpu_the_worker_runs_on_the_cpu(tmp_path):
    chosen = place(preset_job("demo"), tmp_path)  # this machine: NVML finds no driver
    assert chosen.device == "cpu" and "no NVIDIA GPU" in chosen.warning


# ---------------------------------------------------------------- eval.json


def test_eval_results_merge_and_read_back(tmp_path):
    save_results(tmp_path, {"base": {"loss": 8.0}, "final": {"loss": 1.0}})
    save_results(tmp_path, {"checkpoint-30": {"loss": 1.5}, "final": {"loss": 0.9}})
    data = read_eval(tmp_path)
    assert [row[0] for row in table_rows(data)] == ["base", "checkpoint-30", "final"]
    assert data["results"]["final"]["loss"] == 0.9 and data["results"]["base"]["loss"] == 8.0
    (tmp_path / "eval.json").write_text("{not json")
    damaged = read_eval(tmp_path)
    assert damaged["results"] == {} and "evaluate again" in damaged["error"]


# ---------------------------------------------------------------- serve.sh


def test_serve_sh_quotes_every_value(tmp_path):
    hostile = "x$(touch pwned)`touch pwned2`"
    script = tmp_path / "serve.sh"
    script.write_text(render_serve_sh(base_model=hostile, served_name="m;touch pwned3", dtype="bfloat16", lora_rank=12))
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "vllm").write_text(
        "#!/usr/bin/env python3\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n"
    )
    (tmp_path / "bin" / "vllm").chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    argv = json.loads(
        subprocess.run(
            ["bash", str(script), "adapter"], cwd=tmp_path, env=env, capture_output=True, text=True, check=True
        ).stdout
    )
    assert argv[1] == hostile and argv[argv.index("--max-lora-rank") + 1] == "16"
    assert not list(tmp_path.glob("pwned*"))
    assert subprocess.run(["bash", str(script), "other"], env=env, capture_output=True, text=True).returncode == 2
    assert [vllm_max_lora_rank(r) for r in (4, 8, 9, 64, 300, 512)] == [8, 8, 16, 64, 320, 512]


# ---------------------------------------------------------------- push and CLI errors


def test_push_without_network_says_so(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_HUB_OFFLINE")}
    result = tunedeck("push", tmp_path, "--repo-id", "someone/tiny", env={**env, "HF_TOKEN": "hf_test"}, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: push: ")  # no network here: "cannot reach the Hugging Face Hub"
    bad = tunedeck("push", tmp_path, "--repo-id", "no spaces/allowed!", timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("error: --repo-id: ")
    empty = tunedeck("push", tmp_path / "nothing", "--repo-id", "someone/tiny", timeout=60)
    assert empty.returncode == 2 and "holds no model" in empty.stderr


def finished_run(runs_dir: Path, method: str = "lora") -> Path:
    folder = fake_run(runs_dir, RUN_ID, "finished", None)
    (folder / "job.yaml").write_text(yaml.safe_dump({**spec_to_dict(preset_job("demo")), "method": method}))
    (folder / "output").mkdir()
    (folder / "output" / "adapter_model.safetensors").write_bytes(b"")
    return folder


def test_merge_refuses_a_used_output_folder_before_loading_anything(tmp_path):
    finished_run(tmp_path / "runs")
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("mine")
    result = tunedeck("merge", RUN_ID, "-o", used, "--runs-dir", tmp_path / "runs", timeout=60)
    assert result.returncode == 2
    assert (
        result.stderr
        == f"error: -o: {used} already exists and is not an empty folder; choose a new folder for the merged model\n"
    )
    assert [p.name for p in used.iterdir()] == ["keep.txt"]


def test_full_fine_tuning_runs_are_pointed_at_their_output(tmp_path):
    finished_run(tmp_path / "runs", method="full")
    result = tunedeck("chat", RUN_ID, "--prompt", "hi", "--runs-dir", tmp_path / "runs", timeout=60)
    assert result.returncode == 2 and "trained the whole model (method full)" in result.stderr


def test_a_run_that_saved_nothing_yet_says_when_it_will(tmp_path):
    folder = finished_run(tmp_path / "runs")
    (folder / "output" / "adapter_model.safetensors").unlink()
    result = tunedeck("eval", RUN_ID, "--runs-dir", tmp_path / "runs", timeout=60)
    assert (
        result.returncode == 2
        and "has saved no adapter yet" in result.stderr
        and "training.save_steps = 30" in result.stderr
    )


# ---------------------------------------------------------------- two answers side by side


def test_side_by_side_streams_both_answers_and_reports_a_failure():
    from tunedeck.app.worker_tasks import side_by_side

    def failing():
        yield "par"
        raise RuntimeError("worker died")

    updates = list(side_by_side({"tuned": iter([" 7"]), "base": failing()}))
    assert updates[-1] == {"tuned": " 7", "base": "par\n[error: worker died]"}
    assert len(updates) == 3  # one update per piece


def test_leaving_side_by_side_early_closes_the_streams():
    import threading

    from tunedeck.app.worker_tasks import side_by_side

    closed = threading.Event()

    def endless():
        try:
            while True:
                yield "x"
        finally:
            closed.set()  # what a worker's answer does when closed: cancel the generation

    updates = side_by_side({"tuned": endless()})
    assert next(updates) == {"tuned": "x"}
    updates.close()
    assert closed.wait(10)


def test_side_by_side_also_answers_while_a_stream_is_still_loading():
    import time

    from tunedeck.app.worker_tasks import side_by_side

    def loading_then_answering():
        time.sleep(0.8)  # a model still loading: nothing to show yet
        yield " 7"

    updates = list(side_by_side({"tuned": loading_then_answering()}, every_s=0.1))
    assert updates[0] == {"tuned": ""} and len(updates) >= 4  # the caller got to show progress meanwhile
    assert updates[-1] == {"tuned": " 7"}
