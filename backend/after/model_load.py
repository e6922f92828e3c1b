"""Load a run's base model (as the run loaded it) and put an adapter on it. Imports torch: worker only.

The base comes from job.yaml with train.py's own helpers, so a QLoRA adapter is tried on the
same 4-bit base it was trained against. Merging asks for the base in 16 or 32 bits instead
(`quantized=False`): merging into 4-bit weights would round the adapter away.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from tunedeck.backend import recipe
from tunedeck.backend.after.consolidate import adapter_folder
from tunedeck.backend.runs.checkpoints import AfterError, Weights, base_model_path
from tunedeck.backend.spec import JobSpec, spec_to_dict

TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json")


def load_tokenizer(run_dir: Path, job: JobSpec, weights: Weights):
    """The tokenizer saved with the weights (it carries the run's chat template), else the base model's."""

    folder = weights.path if weights.path and any((weights.path / f).is_file() for f in TOKENIZER_FILES) else None
    model_cfg = {**job.model.model_dump(mode="json"), "name_or_path": str(folder or base_model_path(run_dir, job))}
    try:
        tokenizer = recipe.load_tokenizer({"model": model_cfg})
    except (OSError, ValueError) as exc:
        raise AfterError(f"cannot load the tokenizer of {model_cfg['name_or_path']}: {exc}") from None
    return tokenizer  # FSDP checkpoints save none: the base's is the run's own then


def load_base(run_dir: Path, job: JobSpec, device: str, *, quantized: bool = True, dtype: str | None = None):
    """The base model on `device`: 4-bit/8-bit like the run when quantized, else in `dtype` (default the job's)."""
    from transformers import AutoModelForCausalLM

    path = base_model_path(run_dir, job)
    kwargs = {
        "dtype": recipe.torch_dtype(dtype or job.model.dtype),
        "trust_remote_code": job.model.trust_remote_code,
    }
    if job.model.revision:
        kwargs["revision"] = job.model.revision
    bnb = recipe.quantization_config(spec_to_dict(job)) if quantized else None  # the recipe reads job.yaml's dict
    if bnb is not None:
        kwargs["quantization_config"] = bnb
        kwargs["device_map"] = {"": device}
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except (OSError, ValueError) as exc:
        raise AfterError(f"cannot load the base model {path}: {exc}") from None
    _refuse_prequantized(model, path, quantized)
    if bnb is None:
        # PreTrainedModel.to is wrapped by functools.wraps(torch.nn.Module.to), which typeshed types as a function
        # taking self explicitly: a type checker reads the device as `self`. The call itself is transformers' own.
        cast(Any, model).to(device)
    elif device == "cpu":
        _keep_cpu_4bit_layout(model)
    return model.eval()


def loaded_as(model) -> str:
    """How the base's weights are held, in words: "4-bit nf4 (21 Linear4bit layers)" or "float32"."""
    layers = [
        m for m in model.modules() if type(m).__module__.startswith("bitsandbytes")
    ]  # not PEFT's wrappers of them
    four_bit = [m for m in layers if type(m).__name__ == "Linear4bit"]
    if four_bit:
        kind = getattr(four_bit[0].weight.quant_state, "quant_type", "4-bit")
        return f"4-bit {kind} ({len(four_bit)} Linear4bit layers)"
    eight_bit = sum(type(m).__name__ == "Linear8bitLt" for m in layers)
    return (
        f"8-bit ({eight_bit} Linear8bitLt layers)"
        if eight_bit
        else str(next(model.parameters()).dtype).removeprefix("torch.")
    )


def _keep_cpu_4bit_layout(model) -> None:
    # bitsandbytes 0.50 repacks a Linear4bit's weight for its AVX512-bf16 CPU kernel on the first
    # forward in eval mode, and the repacking assumes in_features is a multiple of the quantization
    # block: on the demo's 96-wide layers it fails with "shape '[96, 1]' is invalid for input of size
    # 144" (measured). Such layers keep the generic 4-bit kernel, which training used too.
    for module in model.modules():
        state = getattr(getattr(module, "weight", None), "quant_state", None)
        if hasattr(module, "support_avx512bf16_for_cpu") and state is not None and module.in_features % state.blocksize:
            module.support_avx512bf16_for_cpu = False


def _refuse_prequantized(model, path: str, quantized: bool) -> None:
    # A base stored in 4 bits (e.g. a "-bnb-4bit" upload) cannot give 16-bit weights to merge into.
    if not quantized and getattr(model.config, "quantization_config", None):
        raise AfterError(
            f"the base model {path} is stored quantized ({model.config.quantization_config.get('quant_method', '?')}): "
            "merging needs the 16-bit original; set model.name_or_path to it"
        )


def with_adapter(base, run_dir: Path, job: JobSpec, weights: Weights, progress=None, adapter_name: str = "default"):
    """base wrapped in PEFT with the weights' adapter (consolidated first when sharded)."""
    from peft import PeftModel

    folder = adapter_folder(run_dir, job, weights, progress)
    if isinstance(base, PeftModel):
        base.load_adapter(str(folder), adapter_name=adapter_name)
        base.set_adapter(adapter_name)
        return base
    return PeftModel.from_pretrained(base, str(folder), adapter_name=adapter_name).eval()


def load_model(run_dir: Path, job: JobSpec, weights: Weights, device: str, progress=None):
    """(model, tokenizer) ready to generate: the base, with the adapter unless weights is the base."""
    say = progress or (lambda *a: None)
    say("loading the tokenizer", 0, 3)
    tokenizer = load_tokenizer(run_dir, job, weights)
    say(f"loading the base model {base_model_path(run_dir, job)} on {device}", 1, 3)
    model = load_base(run_dir, job, device)
    if not weights.is_base:
        say(f"loading {weights.describe()}", 2, 3)
        model = with_adapter(model, run_dir, job, weights, progress)
    say("ready", 3, 3)
    return model, tokenizer
