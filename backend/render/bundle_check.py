"""Check a bundle with the libraries that will run it, without launching anything.

    check_bundle(directory) -> BundleCheck   (raises BundleCheckError naming the file)

What each library checks itself (docs/notes/cpu-distributed.md, "Checking configs without launching"):
- accelerate: its config loader reads accelerate_config.yaml; its `launch` parser and
  `_validate_launch_command` resolve the launch line of launch.sh; its environment
  builders (`prepare_multi_gpu_env`, `prepare_deepspeed_cmd_env`, ...) give the
  environment and process count the ranks would get. So the silent one-process traps
  (`--cpu`, MULTI_CPU) show up as a wrong launcher or process count.
- transformers/TRL: `SFTConfig(**training_args.yaml)` is built inside that environment,
  in the bundle folder, exactly like train_sft.py builds it in each rank; accelerate's
  DeepSpeed / FSDP plugin is built from the same environment.
- DeepSpeed: the JSON's "auto" values are resolved the way the Trainer resolves them
  (HfTrainerDeepSpeedConfig.trainer_config_process / trainer_config_finalize), then
  `deepspeed.runtime.config.DeepSpeedConfig` parses the result.
- The installed stack: a library older than the bundle needs (render/requirements.py: minimums)
  is a warning, and is named in the error when a library refuses a file.

The heavy libraries are imported inside the functions: importing this module stays light.
Only one thing is faked: for a job meant for GPUs, the libraries' "is there a (bf16) GPU"
probes answer yes (see _gpu_assumed), since that GPU cannot exist here.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tunedeck.backend.render.accelerate_yaml import DEEPSPEED_CONFIG_FILE
from tunedeck.backend.render.launch import ACCELERATE_CONFIG, JOB_FILE, TRAINING_ARGS_FILE, launch_argv
from tunedeck.backend.render.requirements import REQUIREMENTS_FILE, minimums
from tunedeck.backend.spec import catalog, load_spec_file

# The variables a launcher hands its ranks (the rest of its environment is ours anyway).
_RANK_VARIABLES = (
    "ACCELERATE_",
    "FSDP_",
    "PARALLELISM_CONFIG_",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_",
)

# Stand-in hidden size for "auto" bucket sizes when the model is not in the catalog.
_FALLBACK_HIDDEN_SIZE = 4096


class BundleCheckError(Exception):
    """A library refused a file of the bundle; the message names the file and the library's words."""


@dataclass
class BundleCheck:
    launcher: str  # what `accelerate launch` would start: "multi_gpu" | "deepspeed" | "simple"
    distributed_type: str  # accelerate's, from its config loader
    num_processes: int  # total across machines, as accelerate resolved it
    processes_per_machine: int  # the torchrun --nproc_per_node accelerate would pass
    use_cpu: bool  # what the ranks' SFTConfig says
    env: dict[str, str] = field(repr=False)  # ACCELERATE_* / FSDP_* variables the ranks would get
    sft_config: Any = field(repr=False)  # the real trl.SFTConfig (DPOConfig, KTOConfig, GRPOConfig by objective)
    zero_stage: int | None = None
    deepspeed_config: Any = field(default=None, repr=False)  # the parsed DeepSpeedConfig
    fsdp_plugin: Any = field(default=None, repr=False)  # accelerate's FullyShardedDataParallelPlugin
    parallelism_config: Any = field(default=None, repr=False)  # accelerate's ParallelismConfig (HYBRID_SHARD)
    gpu_assumed: bool = False  # the bundle targets GPUs: GPU probes answered yes (see _gpu_assumed)
    warnings: list[str] = field(default_factory=list)  # installed libraries older than the bundle needs


def check_bundle(directory: str | Path) -> BundleCheck:
    directory = Path(directory).resolve()
    spec = load_spec_file(directory / JOB_FILE)
    warnings = stack_warnings(spec)
    try:
        result = _check_with_libraries(directory, spec)
    except BundleCheckError as exc:
        if warnings:
            raise BundleCheckError(
                f"{exc} (the installed stack is older than this bundle needs: {'; '.join(warnings)})"
            ) from exc
        raise
    result.warnings = warnings
    return result


def stack_warnings(spec) -> list[str]:
    """One line per installed library older than the bundle's minimum for it (or missing)."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import Version

    lines = []
    for need in minimums(spec):
        try:
            installed = version(need.package)
        except PackageNotFoundError:
            lines.append(f"{need.package} is not installed; this bundle needs >= {need.version} ({need.reason})")
            continue
        if Version(installed) < Version(need.version):
            lines.append(
                f"{need.package} {installed} is older than {need.version}, which this bundle needs ({need.reason}): "
                f"pip install -r {REQUIREMENTS_FILE}"
            )
    return lines


def _check_with_libraries(directory: Path, spec) -> BundleCheck:
    cluster = _load_accelerate_config(directory)
    launcher, args, env = _dry_launch(directory, spec)
    training_args = _read_training_args(directory)
    for_gpus = not spec.launch.use_cpu
    if spec.launch.use_cpu and launcher != "simple":
        # A CPU bundle runs its ranks on machines like this one: be rank 0 of a world of one.
        env = {**env, **_rank_zero_environment()}
    with _process_environment(env, directory), _gpu_assumed(for_gpus), _fresh_distributed_state():
        sft_config = _build_sft_config(training_args, {"objective": spec.objective})
        fsdp_plugin = _build_fsdp_plugin() if env.get("ACCELERATE_USE_FSDP") == "true" else None
        parallelism = _build_parallelism() if env.get("ACCELERATE_USE_PARALLELISM_CONFIG") == "true" else None
        deepspeed_config = None
        if env.get("ACCELERATE_USE_DEEPSPEED") == "true":
            ds_file = directory / env.get("ACCELERATE_DEEPSPEED_CONFIG_FILE", DEEPSPEED_CONFIG_FILE)
            deepspeed_config = _check_deepspeed(ds_file, sft_config, spec)
    return BundleCheck(
        launcher=launcher,
        distributed_type=str(cluster.distributed_type.value),
        num_processes=int(args.num_processes),
        processes_per_machine=int(args.nproc_per_node) if getattr(args, "nproc_per_node", None) else 1,
        use_cpu=bool(sft_config.use_cpu),
        env={k: v for k, v in env.items() if k.startswith(_RANK_VARIABLES + ("CUDA_VISIBLE",))},
        sft_config=sft_config,
        fsdp_plugin=fsdp_plugin,
        parallelism_config=parallelism,
        deepspeed_config=deepspeed_config,
        zero_stage=deepspeed_config.zero_optimization_stage if deepspeed_config else None,
        gpu_assumed=for_gpus,
    )


def _read_training_args(directory: Path) -> dict:
    from tunedeck.backend.recipe import JobError, read_yaml  # the entrypoint's own reader: light, no torch

    try:
        return read_yaml(directory / TRAINING_ARGS_FILE, TRAINING_ARGS_FILE)
    except JobError as exc:
        raise BundleCheckError(str(exc)) from None


def _load_accelerate_config(directory: Path):
    from accelerate.commands.config.config_args import load_config_from_file

    try:
        return load_config_from_file(str(directory / ACCELERATE_CONFIG))
    except Exception as exc:  # accelerate raises ValueError/TypeError/KeyError for bad files
        raise BundleCheckError(f"{ACCELERATE_CONFIG}: accelerate's config loader refused it: {exc}") from exc


def _dry_launch(directory: Path, spec) -> tuple[str, Any, dict[str, str]]:
    """Resolve launch.sh's command line as `accelerate launch` does, up to the point of starting processes."""
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import launch as launch_utils

    argv = launch_argv(spec)[1:]  # drop "launch": the parser is the launch subcommand's
    with _cwd(directory):
        try:
            args = launch_command_parser().parse_args(argv)
            args, defaults, mp_from_config = _validate_launch_command(args)
        except (Exception, SystemExit) as exc:
            raise BundleCheckError(f"{ACCELERATE_CONFIG}: `accelerate launch` refused it: {exc}") from exc
        # A port held by another program on THIS machine says nothing about the bundle.
        if launch_utils.is_port_in_use(args.main_process_port or 29500):
            args.main_process_port = 0
        try:
            # The same dispatch as accelerate.commands.launch.launch_command.
            if args.use_deepspeed and not args.cpu:
                fields = list(defaults.deepspeed_config or {}) if isinstance(defaults, ClusterConfig) else []
                if mp_from_config:
                    fields.append("mixed_precision")
                args.deepspeed_fields_from_accelerate_config = ",".join(fields)
                _, env = launch_utils.prepare_deepspeed_cmd_env(args)
                return "deepspeed", args, env
            if (args.use_fsdp or args.multi_gpu) and not args.cpu:
                return "multi_gpu", args, launch_utils.prepare_multi_gpu_env(args)
            _, env = launch_utils.prepare_simple_launcher_cmd_env(args)
            return "simple", args, env
        except Exception as exc:
            raise BundleCheckError(f"{ACCELERATE_CONFIG}: accelerate could not prepare the ranks: {exc}") from exc


def _build_sft_config(training_args: dict, job: dict):
    """The objective's TRL config (SFTConfig; DPOConfig, KTOConfig, GRPOConfig by objective), as train_sft.py builds it."""
    from tunedeck.backend.recipe import objective_classes  # light: trl is imported only when called

    config_class, _ = objective_classes(job)
    try:
        return config_class(**training_args)
    except Exception as exc:  # TypeError for unknown keys, ValueError for bad combinations
        raise BundleCheckError(f"{TRAINING_ARGS_FILE}: trl.{config_class.__name__} refused it: {exc}") from exc


def _build_fsdp_plugin():
    from accelerate.utils import FullyShardedDataParallelPlugin

    try:
        return FullyShardedDataParallelPlugin()  # reads the FSDP_* environment, as in each rank
    except Exception as exc:
        raise BundleCheckError(f"{ACCELERATE_CONFIG}: accelerate's FSDP plugin refused fsdp_config: {exc}") from exc


def _build_parallelism():
    from accelerate.parallelism_config import ParallelismConfig

    try:
        return ParallelismConfig()  # reads the PARALLELISM_CONFIG_* environment, as in each rank
    except Exception as exc:
        raise BundleCheckError(f"{ACCELERATE_CONFIG}: accelerate's ParallelismConfig refused it: {exc}") from exc


def _check_deepspeed(ds_file: Path, sft_config, spec):
    from deepspeed.runtime.config import DeepSpeedConfig
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    try:
        config = json.loads(ds_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BundleCheckError(f"{ds_file.name}: not readable JSON: {exc}") from exc
    arch = catalog.lookup(spec.model.name_or_path)
    hidden_size = arch.hidden_size if arch else _FALLBACK_HIDDEN_SIZE
    # trainer_config_finalize reads only model.config.hidden_size.
    model = SimpleNamespace(config=SimpleNamespace(hidden_size=hidden_size))
    num_steps = spec.training.max_steps if spec.training.max_steps > 0 else 1000
    try:
        hf_config = HfTrainerDeepSpeedConfig(config)
        hf_config.trainer_config_process(sft_config)
        hf_config.trainer_config_finalize(sft_config, model, num_steps)
        return DeepSpeedConfig(hf_config.config)
    except Exception as exc:  # ValueError (mismatch, pydantic), AssertionError (batch arithmetic)
        raise BundleCheckError(f"{ds_file.name}: DeepSpeed refused it: {type(exc).__name__}: {exc}") from exc


@contextlib.contextmanager
def _cwd(directory: Path):
    previous = os.getcwd()
    os.chdir(directory)
    try:
        yield
    finally:
        os.chdir(previous)


def _rank_zero_environment() -> dict[str, str]:
    from accelerate.utils.other import get_free_port

    return {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(get_free_port()),
    }


@contextlib.contextmanager
def _fresh_distributed_state():
    """accelerate's state is a process-wide singleton: start and leave it empty, like a new rank. So is the
    DeepSpeed config a ZeRO-3 SFTConfig registers with transformers (kept alive by BundleCheck.sft_config): left
    set, every later from_pretrained in this process would load under zero.Init."""
    import torch.distributed
    from accelerate.state import AcceleratorState
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        yield
    finally:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        AcceleratorState._reset_state(reset_partial_state=True)
        unset_hf_deepspeed_config()


@contextlib.contextmanager
def _process_environment(env: dict[str, str], directory: Path):
    """Run as a rank would: its environment variables, in the bundle folder (launch.sh cd's there)."""
    saved = dict(os.environ)
    os.environ.update({k: v for k, v in env.items() if k.startswith(_RANK_VARIABLES)})
    try:
        with _cwd(directory):
            yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _gpu_assumed(enabled: bool):
    """For a bundle meant for GPUs: answer the libraries' "is there a GPU" probes with yes.

    Only the probes that refuse a GPU config outright on this machine are answered:
    transformers' bf16-GPU check (SFTConfig with bf16) and the CUDA device lookup of
    accelerate's FSDP plugin (sync_module_states). Nothing runs on the pretend device.
    """
    if not enabled:
        yield
        return
    import accelerate.utils.dataclasses as accelerate_dataclasses
    import torch
    import transformers.training_args as training_args_module

    patches = [
        (training_args_module, "is_torch_bf16_gpu_available", lambda *a, **k: True),
        (accelerate_dataclasses, "is_cuda_available", lambda *a, **k: True),
        (torch.cuda, "current_device", lambda: 0),
    ]
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, fake in patches:
        setattr(owner, name, fake)
    try:
        yield
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)
