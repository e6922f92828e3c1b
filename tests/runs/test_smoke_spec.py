"""The smoke job (backend/runs/smoke.py) without training: what it keeps, what it shrinks, the tiny models, the verdict."""

from __future__ import annotations

import json

import pytest

from tunedeck.backend.runs.manager import RunManager
from tunedeck.backend.runs.smoke import (
    SmokeError,
    Verdict,
    is_smoke_job,
    smoke_home,
    smoke_spec,
    smoke_verdict,
    start_smoke_run,
)
from tunedeck.backend.spec import catalog, load_presets, resolve_spec, spec_to_dict
from tunedeck.backend.validate import validate

KEPT = ["method", "lora", "quantization", "strategy"]


@pytest.mark.parametrize("preset", sorted(load_presets()))
def test_smoke_job_keeps_the_path_and_shrinks_the_size(preset, demo_home):
    spec = resolve_spec(preset)
    smoke = smoke_spec(spec)
    before, after = spec_to_dict(spec), spec_to_dict(smoke)
    for section in KEPT:
        assert after[section] == before[section], section
    assert smoke.model.dtype == spec.model.dtype
    assert smoke.dataset.format == spec.dataset.format
    assert smoke.training.gradient_checkpointing == spec.training.gradient_checkpointing
    # DeepSpeed on CPU refuses bf16: fp32 there; the others keep the job's precision.
    assert smoke.training.precision == ("fp32" if spec.strategy.is_deepspeed else spec.training.precision)
    assert (smoke.launch.use_cpu, smoke.launch.num_processes, smoke.launch.num_machines) == (True, 2, 1)
    assert (smoke.training.max_steps, smoke.training.save_steps, smoke.output_dir) == (3, 3, "output")
    assert smoke.model.name_or_path.startswith(str(smoke_home()))
    assert is_smoke_job(smoke) and not is_smoke_job(spec)
    assert not [p for p in validate(smoke) if p.level == "error"]
    # The FSDP wrap class resolves the same way for the tiny model as for the real one.
    arch, tiny = catalog.lookup(spec.model.name_or_path), catalog.lookup(smoke.model.name_or_path)
    assert (tiny.model_type, tiny.decoder_layer_cls) == (arch.model_type, arch.decoder_layer_cls)
    assert tiny.num_hidden_layers == 2 and tiny.hidden_size == 64


def test_smoke_on_gpus_keeps_the_precision_and_uses_the_gpus_there_are():
    spec = resolve_spec("70b-qlora-zero3")  # 8 GPUs, bf16
    smoke = smoke_spec(spec, gpus=2)
    assert (smoke.launch.use_cpu, smoke.launch.num_processes, smoke.training.precision) == (False, 2, "bf16")
    assert smoke_spec(spec, gpus=16).launch.num_processes == 8


@pytest.mark.parametrize(
    "model",
    ["microsoft/Phi-3-mini-4k-instruct", "google/gemma-2-2b", "Qwen/Qwen2.5-0.5B", "mistralai/Mixtral-8x7B-v0.1"],
)
def test_tiny_model_has_the_architecture_and_module_names(model, demo_home):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    smoke = smoke_spec(resolve_spec("7b-lora-ddp", [f"model.name_or_path={model}", "lora.lora_dropout=0"]))
    arch = catalog.lookup(model)
    tiny = AutoModelForCausalLM.from_pretrained(smoke.model.name_or_path)
    layers = tiny.model.layers
    assert len(layers) == 2 and type(layers[0]).__name__ == arch.decoder_layer_cls
    linear_names = {name.rsplit(".", 1)[-1] for name, m in layers[0].named_modules() if type(m).__name__ == "Linear"}
    assert {w.name for w in arch.layer_weights if w.is_linear} <= linear_names
    assert tiny.config.vocab_size == len(AutoTokenizer.from_pretrained(demo_home / "model"))
    assert tiny.config.tie_word_embeddings == arch.tie_word_embeddings


def test_local_model_keeps_its_own_tokenizer_and_chat_template(demo_home):
    smoke = smoke_spec(resolve_spec("demo"))
    folder = smoke.model.name_or_path
    assert (
        json.loads((demo_home / "model" / "config.json").read_text())["vocab_size"] == catalog.lookup(folder).vocab_size
    )
    assert (demo_home / "model" / "chat_template.jinja").read_text() == (
        smoke_home() / folder / "chat_template.jinja"
    ).read_text()


def test_unknown_architecture_is_refused_with_the_field_and_the_fix():
    with pytest.raises(SmokeError, match="model.name_or_path: the architecture of 'acme/secret-7b' is unknown"):
        smoke_spec(resolve_spec("7b-lora-ddp", ["model.name_or_path=acme/secret-7b"]))


def test_hub_dataset_becomes_the_demo_data_in_the_jobs_format(demo_home):
    spec = resolve_spec(
        "7b-lora-ddp", ["dataset.format=alpaca", "dataset.instruction_field=task", "dataset.eval_split=test"]
    )
    data = smoke_spec(spec).dataset
    assert data.path == str(demo_home / "formats" / "alpaca.jsonl")
    assert (data.format, data.instruction_field, data.split, data.eval_split) == (
        "alpaca",
        "instruction",
        "train[:64]",
        "train[-16:]",
    )
    assert data.max_seq_length == 128


def test_local_dataset_keeps_its_file_and_takes_the_first_rows(demo_home):
    data = smoke_spec(resolve_spec("demo", ["dataset.split=train[:95%]", "dataset.eval_split=train[95%:]"])).dataset
    assert data.path == str(demo_home / "data" / "train.jsonl")
    assert (data.split, data.eval_split) == ("train[:64]", "train[:16]")


@pytest.mark.parametrize(
    "overrides, refused",
    [
        ([], []),  # FSDP2 runs on CPU ranks
        (["strategy.fsdp_version=1"], ["strategy.fsdp_version"]),  # FSDP1 needs GPUs
        (["strategy.offload_params=cpu", "strategy.offload_optimizer=cpu"], ["strategy.offload_params"]),  # pins memory
    ],
)
def test_what_fsdp_runs_on_cpu(overrides, refused):
    problems = validate(resolve_spec("demo", ["strategy.kind=fsdp", *overrides]))
    assert [p.field for p in problems if p.level == "error"] == refused


def test_a_job_that_cannot_be_smoke_tested_starts_nothing(tmp_path, demo_home):
    manager = RunManager(tmp_path / "runs")
    with pytest.raises(SmokeError, match="cannot be smoke-tested on CPU processes:\n- strategy.fsdp_version: FSDP1"):
        start_smoke_run(manager, resolve_spec("13b-lora-fsdp", ["strategy.fsdp_version=1"]))
    with pytest.raises(SmokeError, match="the job has errors:\n- quantization.bits"):
        start_smoke_run(manager, resolve_spec("70b-qlora-zero3", ["quantization.bits=8"]))
    assert manager.list_runs() == []


def write_metrics(run_dir, *records):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


START = {"event": "start", "world_size": 2, "nodes": ["n0", "n0"], "zero_stage": 3, "quantized_modules": {"Linear4bit": 14},
         "trainable_params": 32768}  # fmt: skip


def test_verdict_passes_a_finished_run_with_finite_losses(tmp_path):
    logs = [{"event": "log", "step": s, "loss": 5.9 - s / 100} for s in (1, 2, 3)]
    write_metrics(tmp_path, START, *logs, {"event": "end", "status": "finished", "error": None})
    verdict = smoke_verdict(tmp_path)
    assert verdict.passed
    assert verdict.line == (
        "smoke test passed: 2 ranks on 1 machine · DeepSpeed ZeRO-3 · 14 x Linear4bit · 32,768 trainable parameters; "
        "loss 5.890 -> 5.870 over 3 steps"
    )


def test_verdict_fails_on_the_gate_and_on_a_loss_that_is_not_finite(tmp_path):
    error = "sanity gate: asked 2 processes on 1 machine, got 1: ..."
    write_metrics(tmp_path / "gate", {"event": "end", "status": "failed", "error": error})
    assert smoke_verdict(tmp_path / "gate") == Verdict(False, f"smoke test FAILED: {error}")
    nan = [{"event": "log", "step": 1, "loss": 5.9}, {"event": "log", "step": 2, "loss": float("nan")}]
    write_metrics(tmp_path / "nan", START, *nan, {"event": "end", "status": "finished", "error": None})
    assert smoke_verdict(tmp_path / "nan") == Verdict(
        False, "smoke test FAILED: the loss is not finite (nan) at step 2"
    )
    assert not smoke_verdict(tmp_path / "missing").passed


def test_mixed_in_data_runs_at_toy_scale_too(demo_home, tmp_path):
    text = demo_home / "formats" / "text.jsonl"
    more = tmp_path / "more.jsonl"
    more.write_text(text.read_text())
    hub = "HuggingFaceH4/ultrachat_200k:train_sft#5000"
    # The job's hub dataset becomes the demo's: its hub mix source does too, a local one keeps its file.
    smoke = smoke_spec(resolve_spec("7b-lora-ddp", [f"dataset.mix={hub}, {more}"]))
    assert smoke.dataset.mix == [f"{text}:train#8", f"{more}:train#8"]
    # With a local dataset of its own columns, a hub source (not fetched here) is left out.
    local = resolve_spec("demo", [f"dataset.mix={hub}, {demo_home / 'formats' / 'prompt-completion.jsonl'}#300"])
    assert smoke_spec(local).dataset.mix == [f"{demo_home / 'formats' / 'prompt-completion.jsonl'}:train#8"]
