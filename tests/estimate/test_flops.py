"""FLOPs per token, the GPU peak table, and the recipe's MFU records (backend/recipe/speed.py, backend/spec/flops.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tunedeck.backend import recipe
from tunedeck.backend.spec import catalog, flops


def test_flops_per_token_full_lora_and_checkpointing_by_hand():
    n, layers, width, seq = 1000, 2, 8, 16
    attention = 4 * layers * width * seq  # forward QK^T and AV
    model, hardware = flops.flops_per_token(n, n, layers, width, seq, full=True, checkpointing=False)
    assert model == hardware == 6 * n + 3 * attention  # PaLM: 6N + 12 L d T
    model, _ = flops.flops_per_token(n, 10, layers, width, seq, full=False, checkpointing=False)
    assert model == 4 * n + 2 * 10 + 3 * attention  # frozen weights: no weight gradients
    model, hardware = flops.flops_per_token(n, 10, layers, width, seq, False, True, layer_matmul_params=900)
    assert hardware - model == 2 * 900 + attention  # one more forward of the layers, not of the head
    lora = 4 * n + 2 * 10 + 3 * attention
    dpo, _ = flops.flops_per_token(n, 10, layers, width, seq, False, False, extra_forwards=1)
    assert dpo - lora == 2 * n + attention  # DPO: the reference's forward, head included
    kto, _ = flops.flops_per_token(n, 10, layers, width, seq, False, False, extra_forwards=3)
    assert kto - lora == 3 * (2 * n + attention)  # KTO: the reference's, and the KL answer's with both models


def test_llama2_7b_costs_about_six_times_its_parameters_per_token():
    arch = catalog.lookup("meta-llama/Llama-2-7b-hf")
    matmul, _ = flops.arch_matmul_params(arch)
    assert (
        matmul == arch.num_parameters - arch.embedding_params - arch.num_hidden_layers * arch.layer_norm_params - 4096
    )
    full, _ = flops.arch_flops_per_token(arch, arch.num_parameters, 2048, full=True, checkpointing=False)
    assert 6 * 6.4e9 < full < 6 * 7.5e9  # 6N plus attention's 12 x 32 x 4096 x 2048 = 3.2 GFLOPs
    lora, _ = flops.arch_flops_per_token(arch, 20_000_000, 2048, full=False, checkpointing=False)
    assert lora / full == pytest.approx(2 / 3, abs=0.03)  # LoRA saves the weight gradients' third


def test_mixture_of_experts_counts_the_routed_experts_only():
    arch = catalog.lookup("mistralai/Mixtral-8x7B-v0.1")
    matmul, _ = flops.arch_matmul_params(arch)
    assert 12e9 < matmul < 14e9  # Mixtral: 12.9B active of 46.7B parameters (Mistral AI's announcement)


@pytest.mark.parametrize(
    ("nvml_name", "dtype", "tflops"),
    [
        ("NVIDIA A100-SXM4-80GB", "bf16", 312),
        ("NVIDIA A100-PCIE-40GB", "bf16", 312),
        ("NVIDIA H100 80GB HBM3", "bf16", 989),
        ("NVIDIA H100 PCIe", "bf16", 756),
        ("NVIDIA H100 NVL", "fp16", 835),
        ("NVIDIA H200", "bf16", 989),
        ("NVIDIA L40S", "bf16", 362),
        ("NVIDIA L4", "bf16", 121),
        ("NVIDIA A10G", "bf16", 70),
        ("NVIDIA A10", "bf16", 125),
        ("NVIDIA GeForce RTX 4090", "bf16", 165.2),
        ("NVIDIA GeForce RTX 3090", "fp16", 71),
        ("NVIDIA RTX A6000", "bf16", 154.8),
        ("Tesla V100-SXM2-32GB", "fp16", 125),
        ("A100-40GB", "tf32", 156),  # the names people type work too
        ("RTX 4090", "fp32", 82.6),
    ],
)
def test_peaks_by_nvml_name(nvml_name, dtype, tflops):
    peak, source = flops.peak_tflops(nvml_name, dtype)
    assert peak == tflops and source.startswith("https://")


def test_no_peak_is_made_up():
    assert flops.peak_tflops("Tesla V100-SXM2-16GB", "bf16") == (
        None,
        "V100-16GB has no bf16 tensor units in its datasheet",
    )
    peak, why = flops.peak_tflops("Some Future GPU", "bf16")
    assert peak is None and flops.PEAK_ENV in why
    assert all(row[5].startswith("https://") for row in flops.GPU_TABLE)


def _recorder(tmp_path, monkeypatch, speed: dict):
    """train.py's callback with a stepped clock: what it writes for given speed facts."""
    from transformers import TrainerControl

    clock = [1000.0]
    monkeypatch.setattr(recipe.recorder, "time", SimpleNamespace(time=lambda: clock[0], monotonic=lambda: clock[0]))
    recorder = recipe.make_callback(recipe.JsonlWriter(tmp_path / "metrics.jsonl"), recipe.StopRequest(), {}, None)
    recorder.speed = speed
    args = SimpleNamespace(device="cpu", per_device_train_batch_size=2, gradient_accumulation_steps=2)
    state = SimpleNamespace(global_step=0, max_steps=10, epoch=0.0)
    for tokens in (400, 800):  # one step a second, 4 rows of 100 tokens each
        clock[0] += 1
        state.global_step += 1
        recorder.on_step_end(args, state, TrainerControl())
        recorder.on_log(args, state, TrainerControl(), logs={"loss": 1.0, "num_tokens": tokens})
    return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]


FACTS = {"matmul_params": 10**6, "layer_matmul_params": 9 * 10**5, "trainable_params": 10**4, "layers": 2,
         "attention_width": 64, "full": False, "checkpointing": True}  # fmt: skip


def test_mfu_and_hfu_per_logging_step(tmp_path, monkeypatch):
    records = _recorder(tmp_path, monkeypatch, {"peak_tflops": 1e-3, "flops_inputs": FACTS})
    model, hardware = flops.flops_per_token(10**6, 10**4, 2, 64, 100, False, True, 9 * 10**5)
    for r in records:  # 400 tokens/s on one process, against a 1 GFLOPS peak
        assert r["tokens_per_second"] == 400
        assert r["mfu"] == pytest.approx(400 * model / 1e9)
        assert r["hfu"] == pytest.approx(400 * hardware / 1e9) and r["hfu"] > r["mfu"]


def test_a_dpo_runs_mfu_counts_the_reference_pass_over_two_sequences_a_row(tmp_path, monkeypatch):
    inputs = {**FACTS, "extra_forwards": 1, "sequences_per_row": 2}
    records = _recorder(tmp_path, monkeypatch, {"peak_tflops": 1e-3, "flops_inputs": inputs})
    # The same 400 tokens a step are 4 rows' chosen and rejected answers: 8 sequences of 50 tokens.
    model, _ = flops.flops_per_token(10**6, 10**4, 2, 64, 50, False, True, 9 * 10**5, extra_forwards=1)
    assert all(r["mfu"] == pytest.approx(400 * model / 1e9) for r in records)


def test_a_kto_runs_mfu_counts_three_more_forwards_over_one_sequence_a_row(tmp_path, monkeypatch):
    inputs = {**FACTS, "extra_forwards": 3, "sequences_per_row": 1}
    records = _recorder(tmp_path, monkeypatch, {"peak_tflops": 1e-3, "flops_inputs": inputs})
    model, _ = flops.flops_per_token(10**6, 10**4, 2, 64, 100, False, True, 9 * 10**5, extra_forwards=3)
    assert all(r["mfu"] == pytest.approx(400 * model / 1e9) for r in records)
    assert (flops.extra_forwards("kto"), flops.sequences_per_row("kto")) == (3, 1)
    assert (flops.extra_forwards("dpo"), flops.sequences_per_row("dpo")) == (1, 2)


def test_scores_precomputed_before_training_leave_the_steps_only_the_models_own_forwards():
    # DPO's reference pass goes; KTO keeps the model's own forward of the KL answer.
    assert flops.extra_forwards("dpo", precomputed=True) == 0
    assert flops.extra_forwards("kto", precomputed=True) == 1
    assert flops.extra_forwards("sft", precomputed=True) == flops.extra_forwards("sft") == 0


def test_no_peak_no_mfu(tmp_path, monkeypatch):
    records = _recorder(tmp_path, monkeypatch, {"peak_tflops": None, "mfu_note": "...", "flops_inputs": FACTS})
    assert records and not any("mfu" in r or "hfu" in r for r in records)


def _tiny_trainer(trainable_adapter: bool):
    """What speed_facts reads of a trainer: a model of Linear layers with a config, args, the accelerator state."""
    import torch

    class Tiny(torch.nn.Module):
        config = SimpleNamespace(num_attention_heads=4, hidden_size=32, num_hidden_layers=2)

        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(2))
            self.lm_head = torch.nn.Linear(32, 100, bias=False)

    args = SimpleNamespace(bf16=False, fp16=False, device=torch.device("cpu"), gradient_checkpointing=True)
    accelerator = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=None))
    return SimpleNamespace(model=Tiny(), args=args, accelerator=accelerator)


def test_speed_facts_count_the_live_model_and_never_make_up_a_peak(monkeypatch):
    monkeypatch.delenv(flops.PEAK_ENV, raising=False)
    facts = recipe.speed_facts(_tiny_trainer(False), trainable=100, total=5000)
    assert facts["flops_inputs"] == {
        "matmul_params": 2 * 32 * 32 + 32 * 100, "layer_matmul_params": 2 * 32 * 32, "trainable_params": 100,
        "layers": 2, "attention_width": 32, "full": False, "checkpointing": True, "extra_forwards": 0,
        "sequences_per_row": 1,
    }  # fmt: skip
    assert facts["gpu_name"] is None and facts["peak_tflops"] is None
    kto = recipe.speed_facts(_tiny_trainer(False), 100, 5000, "kto")["flops_inputs"]
    assert (kto["extra_forwards"], kto["sequences_per_row"]) == (3, 1)
    assert facts["mfu_note"].startswith("MFU is not defined without a known peak: this run computes on CPU")
    monkeypatch.setenv(flops.PEAK_ENV, "12.5")
    assert recipe.speed_facts(_tiny_trainer(False), 100, 5000)["peak_tflops"] == 12.5
    for typo in ("twelve", "nan", "-3"):
        monkeypatch.setenv(flops.PEAK_ENV, typo)
        facts = recipe.speed_facts(_tiny_trainer(False), 100, 5000)
        assert facts["peak_tflops"] is None and f"{flops.PEAK_ENV}={typo!r} is not a number" in facts["mfu_note"]
