"""The sanity gate's rules in train.py: what a job expects, and how each difference is worded (no training)."""

from __future__ import annotations

import pytest

from tunedeck.backend import recipe
from tunedeck.backend.spec import resolve_spec, spec_to_dict


def job(preset: str, *overrides: str) -> dict:
    return spec_to_dict(resolve_spec(preset, list(overrides)))


def facts(**changes) -> dict:
    """A start record of a 2-rank DeepSpeed ZeRO-3 QLoRA run on one machine."""
    record = {
        "world_size": 2, "nodes": ["n0", "n0"], "distributed_type": "DEEPSPEED", "zero_stage": 3, "fsdp": False,
        "fsdp_version": None, "model_class": "DeepSpeedEngine", "quantized_modules": {"Linear4bit": 14},
        "trainable_params": 32768,
    }  # fmt: skip
    return {**record, **changes}


def expected(preset: str = "70b-qlora-zero3", *overrides: str, trainable: int | None = 32768) -> dict:
    out = recipe.expected_run(job(preset, "launch.num_processes=2", *overrides))
    out["trainable_params"] = trainable
    return out


def test_what_each_preset_expects():
    assert recipe.expected_run(job("70b-qlora-zero3")) == {
        "world_size": 8, "machines": 1, "engine": "deepspeed", "zero_stage": 3, "sequence_parallel": 1,
        "fsdp_version": None, "bits": 4, "trainable_params": None, "lora_scaling": 2.0, "neftune_noise_alpha": None,
    }  # fmt: skip
    rslora = recipe.expected_run(job("70b-qlora-zero3", "lora.use_rslora=true"))["lora_scaling"]
    assert rslora == pytest.approx(32 / 16**0.5)  # lora_alpha / sqrt(r)
    assert recipe.expected_run(job("7b-full-zero2"))["lora_scaling"] is None
    assert recipe.expected_run(job("demo", "training.neftune_noise_alpha=5"))["neftune_noise_alpha"] == 5
    assert recipe.expected_run(job("demo-dpo", "training.neftune_noise_alpha=5"))["neftune_noise_alpha"] is None
    assert recipe.expected_run(job("13b-lora-fsdp"))["engine"] == "fsdp"
    assert recipe.expected_run(job("13b-lora-fsdp"))["fsdp_version"] == 2
    assert recipe.expected_run(job("7b-lora-ddp"))["engine"] == "ddp"
    assert recipe.expected_run(job("7b-lora-ddp", "launch.num_processes=1"))["engine"] == "none"


def test_a_run_that_got_what_it_asked_passes():
    assert recipe.gate_problems(expected(), facts()) == []


@pytest.mark.parametrize(
    "changes, overrides, message",
    [
        (
            {"world_size": 1, "nodes": ["n0"]},
            [],
            "asked 2 processes on 1 machine, got 1: the processes did not join one run",
        ),
        (
            {"nodes": ["n0", "n1"]},
            [],
            "asked 2 processes on 1 machine, got 2 on 2 machines (n0, n1): start launch.sh once",
        ),
        (
            {},
            ["launch.num_machines=2", "launch.main_process_ip=10.0.0.1"],
            "asked 2 processes on 2 machines, got 2 on 1 machine (n0)",
        ),
        ({"zero_stage": 2}, [], "asked DeepSpeed ZeRO-3, got ZeRO-2"),
        (
            {"sequence_parallel": 1},
            ["strategy.sequence_parallel=2", "dataset.packing=false"],
            "asked 2 GPUs per sequence (strategy.sequence_parallel), got 1 (accelerate takes it from "
            "accelerate_config.yaml's parallelism_config",
        ),
        (
            {"zero_stage": None, "distributed_type": "MULTI_GPU", "model_class": "DistributedDataParallel"},
            [],
            "asked DeepSpeed ZeRO-3, got DDP (MULTI_GPU)",
        ),
        ({"quantized_modules": {}}, [], "asked a 4-bit base (quantization.bits=4), got no Linear4bit module"),
        ({"trainable_params": 65536}, [], "asked 32,768 trainable parameters (PEFT's count for the job), got 65,536"),
        ({"lora_scaling": 2.0}, ["lora.use_rslora=true"], "asked adapters scaled by 8 (lora.lora_alpha, lora.r, "),
        ({"neftune_noise_alpha": None}, ["training.neftune_noise_alpha=5"], "asked NEFTune noise 5.0, got None"),
    ],
)
def test_each_difference_is_named(changes, overrides, message):
    problems = recipe.gate_problems(expected("70b-qlora-zero3", *overrides), facts(**changes))
    assert len(problems) == 1 and problems[0].startswith(message), problems


def test_fsdp_that_became_ddp_is_named_once_the_model_is_wrapped():
    fsdp = expected("13b-lora-fsdp")
    early = {"world_size": 2, "nodes": ["n0", "n0"], "distributed_type": "MULTI_CPU"}
    assert recipe.gate_problems(fsdp, early) == []  # before wrapping, FSDP ranks look like DDP ranks
    ddp = facts(
        distributed_type="MULTI_CPU", zero_stage=None, model_class="DistributedDataParallel", quantized_modules={}
    )
    (problem,) = recipe.gate_problems(fsdp, ddp)
    assert problem.startswith("asked FSDP2, got DDP (MULTI_CPU) (accelerate falls back to DDP")
    fsdp1 = facts(
        distributed_type="FSDP",
        zero_stage=None,
        fsdp=True,
        fsdp_version=1,
        model_class="FullyShardedDataParallel",
        quantized_modules={},
    )
    assert recipe.gate_problems(fsdp, fsdp1) == ["asked FSDP2, got FSDP1"]


def test_the_launchers_environment_alone_catches_a_lone_process(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(recipe.GateError, match="^sanity gate: asked 2 processes on 1 machine, got 1: "):
        recipe.check_processes(expected())
    monkeypatch.setenv("WORLD_SIZE", "2")
    recipe.check_processes(expected())  # the launcher started both: on to the process group


@pytest.mark.parametrize("preset", ["demo", "demo-full"])
def test_expected_trainable_is_what_peft_counts_on_the_real_model(preset, demo_home):
    """The meta-device count equals PEFT's count on the loaded model (and, for full fine-tuning, every parameter)."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    spec_job = job("demo", "method=full") if preset == "demo-full" else job("demo")
    model = AutoModelForCausalLM.from_pretrained(demo_home / "model")
    adapter = recipe.peft_config(spec_job)
    real = (
        get_peft_model(model, adapter).get_nb_trainable_parameters()[0]
        if adapter
        else sum(p.numel() for p in model.parameters())
    )
    assert recipe.expected_trainable(spec_job) == real > 0


def test_expected_trainable_of_an_unreadable_model_is_left_to_the_loader(capsys):
    assert recipe.expected_trainable({"model": {"name_or_path": "/nonexistent/model"}, "method": "lora"}) is None
    assert "trainable parameters not checked" in capsys.readouterr().out


def restored(**changes) -> dict:
    """The "restored" facts of a run resumed from checkpoint-8 that got everything back."""
    saved = {"step": 8, "learning_rate": 0.0019, "rows": 32, "global_batch": 4, "data_parallel": 2}
    got = {
        "checkpoint": "checkpoint-8", "step": 8, "optimizer_step": 8, "lr_schedule_step": 8, "learning_rate": 0.0019,
        "data_rows": 32, "ignore_data_skip": False, "resharded_from": 2, "saved": saved,
    }  # fmt: skip
    return {**got, **changes}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"optimizer_step": 0}, "but the optimizer's state is at step 0: its moments were not restored"),
        ({"lr_schedule_step": 0}, "but the learning-rate schedule is at step 0"),
        ({"learning_rate": 0.002}, "but the learning rate is 0.002 where the checkpoint's schedule had 0.0019"),
        ({"data_rows": 16}, "but its data position is row 16 where the checkpoint had seen 32"),
    ],
)
def test_a_resume_that_did_not_get_its_position_back_is_named(changes, message):
    assert recipe.gate_problems(expected(), facts(restored=restored())) == []
    problems = recipe.gate_problems(expected(), facts(restored=restored(**changes)))
    assert len(problems) == 1 and problems[0].startswith("resumed from checkpoint-8 (step 8), " + message.split(",")[0])
    assert message in problems[0], problems


def test_a_resume_from_a_checkpoint_without_its_position_checks_the_steps_alone():
    old = restored(saved=None, data_rows=16, learning_rate=1.0)  # a checkpoint saved before position.json
    assert recipe.gate_problems(expected(), facts(restored=old)) == []
    assert recipe.gate_problems(expected(), facts(restored=restored(data_rows=16, ignore_data_skip=True))) == []
