"""Every preset x every strategy kind: the generated files pass the libraries' own checks.

accelerate loads the YAML and resolves the launch line into the processes it would
start; TRL builds the SFTConfig inside the ranks' environment; DeepSpeed parses its
JSON after transformers resolved the "auto" values. See backend/render/bundle_check.py.
"""

from __future__ import annotations

import json

import pytest

from tunedeck.backend.recipe.vocabulary import OBJECTIVE_FORMATS, STRATEGIES
from tunedeck.backend.render.training_args import SFT_ARGUMENTS
from tunedeck.backend.spec import JobSpec, flat_values, resolve_spec
from tunedeck.backend.spec.applies import applies, when
from tunedeck.backend.spec.catalog import lookup
from tunedeck.backend.validate import has_errors, validate

from .conftest import PRESET_IDS, STRATEGY_KINDS

# kind: (accelerate's distributed_type as the strategy table gives it, what `accelerate launch` starts)
EXPECTED = {
    kind: (s.distributed_type, "deepspeed" if s.is_deepspeed else "multi_gpu") for kind, s in STRATEGIES.items()
}


@pytest.mark.parametrize("kind", STRATEGY_KINDS)
@pytest.mark.parametrize("preset", PRESET_IDS)
def test_every_preset_and_strategy_passes_the_libraries(preset, kind, export, check):
    spec = resolve_spec(preset, [f"strategy.kind={kind}"])
    problems = validate(spec)
    assert not has_errors(problems), problems

    result = check(export(spec))
    assert result.warnings == []  # the installed stack is what the bundle pins (constraints.txt)

    distributed_type, launcher = EXPECTED[kind]
    assert result.distributed_type == distributed_type
    assert result.launcher == launcher
    assert result.num_processes == spec.launch.num_processes
    assert result.processes_per_machine == spec.launch.processes_per_machine
    args = result.sft_config
    assert args.per_device_train_batch_size == spec.training.per_device_train_batch_size
    assert args.gradient_accumulation_steps == spec.training.gradient_accumulation_steps
    if spec.objective == "grpo":  # GRPOConfig has no max_length: the answers stop at max_completion_length
        assert args.num_generations == spec.grpo.num_generations
        assert args.max_completion_length == spec.grpo.max_completion_length
        assert args.generation_batch_size % args.num_generations == 0  # TRL's own check passed, and agrees
    else:
        assert args.max_length == spec.dataset.max_seq_length
    assert args.bf16 == (spec.training.precision == "bf16")
    assert args.fp16 == (spec.training.precision == "fp16")
    assert args.activation_checkpointing == spec.training.gradient_checkpointing
    if spec.launch.use_cpu:
        # DDP and FSDP2 ranks must say use_cpu themselves (train_sft.py turns the CPU ranks' DDP into
        # FSDP2); DeepSpeed ranks must not (its CPU accelerator runs them).
        assert result.use_cpu == (not STRATEGIES[kind].is_deepspeed)
        assert args.ddp_backend == "gloo"
        assert result.gpu_assumed is False

    if STRATEGIES[kind].is_deepspeed:
        assert result.env["ACCELERATE_USE_DEEPSPEED"] == "true"
        ds = result.deepspeed_config
        assert ds.zero_optimization_stage == int(kind[-1])
        assert ds.zero_enabled
        # One process resolves the "auto" batch for itself; the ranks multiply it by the world size.
        per_rank_batch = spec.training.per_device_train_batch_size * spec.training.gradient_accumulation_steps
        assert ds.train_batch_size == per_rank_batch
        assert ds.train_batch_size * spec.launch.num_processes == spec.global_batch_size
        assert ds.bfloat16_config.enabled == (spec.training.precision == "bf16")
        assert ds.gradient_clipping == spec.training.max_grad_norm
    else:
        assert "ACCELERATE_USE_DEEPSPEED" not in result.env
    if STRATEGIES[kind].engine == "fsdp":
        plugin = result.fsdp_plugin
        assert result.env["ACCELERATE_USE_FSDP"] == "true"
        assert plugin.fsdp_version == spec.strategy.fsdp_version
        # The catalog's decoder layer of the model (Qwen2.5 presets: Qwen2DecoderLayer; Llama: LlamaDecoderLayer).
        assert plugin.transformer_cls_names_to_wrap == [lookup(spec.model.name_or_path).decoder_layer_cls]
        assert plugin.activation_checkpointing == spec.strategy.fsdp_activation_checkpointing


def test_70b_qlora_zero3_bundle_is_stage3_with_sharded_init(export, check):
    spec = resolve_spec("70b-qlora-zero3")
    folder = export(spec)
    result = check(folder)
    assert result.zero_stage == 3
    assert result.env["ACCELERATE_DEEPSPEED_ZERO3_INIT"] == "true"
    # transformers filled the hidden-size "auto" values from Llama-2-70B's hidden size 8192.
    zero = result.deepspeed_config.zero_config
    assert zero.reduce_bucket_size == 8192 * 8192
    assert zero.prefetch_bucket_size == int(0.9 * 8192 * 8192)
    assert zero.param_persistence_threshold == 10 * 8192
    raw = json.loads((folder / "ds_config.json").read_text())
    assert raw["train_micro_batch_size_per_gpu"] == "auto"


def test_offload_variants_pass_deepspeed(export, check):
    cpu = resolve_spec("7b-full-zero2", ["strategy.offload_optimizer=cpu"])
    result = check(export(cpu))
    assert result.deepspeed_config.zero_config.offload_optimizer.device == "cpu"
    # With ZeRO-Offload DeepSpeed needs its own CPU optimizer: the JSON names one.
    assert result.deepspeed_config.optimizer_name == "adamw"

    nvme = resolve_spec(
        "70b-qlora-zero3",
        ["strategy.offload_optimizer=nvme", "strategy.offload_params=nvme", "strategy.nvme_path=/local_nvme"],
    )
    zero = check(export(nvme)).deepspeed_config.zero_config
    assert zero.offload_param.device == "nvme"
    assert str(zero.offload_param.nvme_path) == "/local_nvme"
    assert zero.offload_optimizer.device == "nvme"


def test_fp16_deepspeed_uses_dynamic_loss_scaling(export, check):
    spec = resolve_spec("7b-full-zero2", ["training.precision=fp16", "model.dtype=float16"])
    ds = check(export(spec)).deepspeed_config
    assert ds.float16_config.enabled
    assert ds.float16_config.loss_scale == 0  # 0 = dynamic


def test_single_process_is_not_distributed(export, check):
    result = check(export(resolve_spec("7b-lora-ddp", ["launch.num_processes=1"])))
    assert (result.distributed_type, result.launcher, result.num_processes) == ("NO", "simple", 1)
    cpu = check(export(resolve_spec("demo", ["launch.num_processes=1"])))
    assert (cpu.launcher, cpu.use_cpu) == ("simple", True)
    assert cpu.sft_config.ddp_backend is None  # a lone process has no gloo group to join


def test_two_machines_split_the_processes(export, check):
    spec = resolve_spec(
        "70b-qlora-zero3",
        [
            "launch.num_machines=2",
            "launch.num_processes=16",
            "launch.main_process_ip=10.0.0.1",
            "launch.machine_rank=1",
        ],
    )
    result = check(export(spec))
    assert (result.num_processes, result.processes_per_machine) == (16, 8)


def test_hybrid_shard_replicates_across_machines(export, check):
    spec = resolve_spec(
        "13b-lora-fsdp",
        [
            "launch.num_machines=2",
            "launch.num_processes=8",
            "launch.main_process_ip=10.0.0.1",
            "strategy.fsdp_sharding_strategy=HYBRID_SHARD",
        ],
    )
    result = check(export(spec))
    parallelism = result.parallelism_config
    assert (parallelism.dp_replicate_size, parallelism.dp_shard_size) == (2, 4)
    assert parallelism.total_size == 8


def test_fsdp1_sharding_strategy_and_offload(export, check):
    from torch.distributed.fsdp import ShardingStrategy

    spec = resolve_spec(
        "13b-lora-fsdp",
        ["strategy.fsdp_version=1", "strategy.fsdp_sharding_strategy=SHARD_GRAD_OP", "strategy.offload_params=cpu"],
    )
    plugin = check(export(spec)).fsdp_plugin
    assert plugin.fsdp_version == 1
    # accelerate wraps FSDP1 with `sharding_strategy or reshard_after_forward` (accelerator.py).
    assert (plugin.sharding_strategy or plugin.reshard_after_forward) == ShardingStrategy.SHARD_GRAD_OP
    assert plugin.cpu_offload.offload_params is True


@pytest.mark.parametrize(
    "file, edit, words",
    [
        ("ds_config.json", lambda text: text.replace('"stage": 3', '"stage": 7'), "Input should be 0, 1, 2, 3"),
        (
            "ds_config.json",
            lambda text: text.replace('"train_batch_size": "auto"', '"train_batch_size": 999'),
            "train_batch_size",
        ),
        ("accelerate_config.yaml", lambda text: text + "num_gpus: 8\n", "unknown keys"),
        ("accelerate_config.yaml", lambda text: text.replace("num_processes: 8", "num_processes: -1"), "num_processes"),
        ("training_args.yaml", lambda text: text + "learning_rat: 0.1\n", "learning_rat"),
        ("training_args.yaml", lambda text: text.replace("fp16: false", "fp16: true"), "fp16 and bf16"),
    ],
)
def test_the_checks_refuse_broken_files(file, edit, words, export, check):
    """The checks are real: a broken file is refused, with the file named and the library's words."""
    from tunedeck.backend.render.bundle_check import BundleCheckError

    folder = export(resolve_spec("70b-qlora-zero3"))
    path = folder / file
    path.write_text(edit(path.read_text()))
    with pytest.raises(BundleCheckError) as err:
        check(folder)
    assert str(err.value).startswith(f"{file}: ")
    assert words in str(err.value)


def test_every_declared_argument_is_one_of_its_objectives_config():
    import dataclasses

    from tunedeck.backend.recipe import objective_classes

    defaults = flat_values(JobSpec())
    for objective in OBJECTIVE_FORMATS:
        config = objective_classes({"objective": objective})[0]
        names = {f.name for f in dataclasses.fields(config)}
        for path, name in SFT_ARGUMENTS.items():
            # Each objective's config takes every argument of a field that applies with it, in any of its formats.
            formats = [{**defaults, "objective": objective, "dataset.format": f} for f in OBJECTIVE_FORMATS[objective]]
            if not {"objective", "dataset.format"} & set(when(path).reads) or any(applies(path, v) for v in formats):
                assert name in names, f"{path} is written as {name}, which trl.{config.__name__} does not take"


def test_a_refused_zero3_config_leaves_no_deepspeed_config_behind_for_later_loads(export, check):
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    from tunedeck.backend.render.bundle_check import BundleCheckError

    folder = export(resolve_spec("70b-qlora-zero3"))
    path = folder / "ds_config.json"
    path.write_text(path.read_text().replace('"train_batch_size": "auto"', '"train_batch_size": 999'))
    with pytest.raises(BundleCheckError) as err:
        check(folder)
    # The refusal's traceback keeps the ZeRO-3 config transformers registered alive: left set, a later
    # from_pretrained in this process loaded under zero.Init (a test that ran after it failed so).
    assert "train_batch_size" in str(err.value) and not is_deepspeed_zero3_enabled()
