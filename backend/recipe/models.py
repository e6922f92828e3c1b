"""The model, its tokenizer and its adapters, loaded as job.yaml says (the training stack imported when called)."""

from __future__ import annotations

import os
import sys

from .job import JobError


def torch_dtype(name: str):
    import torch

    try:
        return getattr(torch, name)
    except AttributeError:
        raise JobError(f"model.dtype: unknown dtype {name!r}; use bfloat16, float16 or float32") from None


BNB_OPTIMIZERS = ("adamw_bnb_8bit", "paged_adamw_8bit", "paged_adamw_32bit")  # training.optim's bitsandbytes ones


def leave_out_unused_bitsandbytes(job: dict, training_args: dict) -> None:
    """A job that neither quantizes nor uses a bitsandbytes optimizer never imports bitsandbytes.

    PEFT imports it whenever it is installed, and its import pulls in torch's inductor and probes its
    kernels: about a fifth of each rank's start here (import of torch, transformers, TRL, PEFT: 17.2 s with
    it, 14.1 s without, three runs each side by side on a loaded 2-core machine). None in sys.modules makes
    importlib.util.find_spec say "not installed" to transformers and PEFT. Call before they are imported.
    """
    if (job.get("quantization") or {}).get("bits") or training_args.get("optim") in BNB_OPTIMIZERS:
        return
    if "bitsandbytes" not in sys.modules:
        sys.modules["bitsandbytes"] = None  # type: ignore[assignment]  # find_spec's own "not installed"


def quantization_config(job: dict):
    """BitsAndBytesConfig from job.quantization (its keys are BitsAndBytesConfig's, plus `bits`)."""
    quant = dict(job.get("quantization") or {})
    bits = quant.pop("bits", None)
    if not bits:
        return None
    from transformers import BitsAndBytesConfig

    if bits == 8:
        return BitsAndBytesConfig(load_in_8bit=True)
    if bits != 4:
        raise JobError(f"quantization.bits: {bits} is not supported; use 4 or 8")
    quant["bnb_4bit_compute_dtype"] = torch_dtype(quant.get("bnb_4bit_compute_dtype", "bfloat16"))
    return BitsAndBytesConfig(load_in_4bit=True, **quant)


def load_model(job: dict, args):
    from transformers import AutoModelForCausalLM

    model_cfg = job.get("model") or {}
    bnb = quantization_config(job)
    kwargs = {
        "dtype": torch_dtype(model_cfg.get("dtype", "float32")),
        "attn_implementation": model_cfg.get("attn_implementation") or "sdpa",
        "trust_remote_code": bool(model_cfg.get("trust_remote_code", False)),
    }
    if model_cfg.get("revision"):
        kwargs["revision"] = model_cfg["revision"]
    sharded = is_sharded_run()
    if bnb is not None:
        kwargs["quantization_config"] = bnb
        if not sharded:
            # DDP: each rank holds the whole quantized model on its own device (TRL's get_kbit_device_map).
            # Under ZeRO-3 transformers refuses any device_map ("DeepSpeed Zero-3 is not compatible with
            # passing a device_map"); without one, bitsandbytes places the model on the rank's current
            # device, as the PEFT docs' ZeRO-3 and FSDP QLoRA recipes load it.
            kwargs["device_map"] = {"": str(args.device)}
    model = AutoModelForCausalLM.from_pretrained(model_cfg["name_or_path"], **kwargs)
    if bnb is not None and not sharded:
        # Not for sharded QLoRA: it upcasts the non-quantized weights to fp32 (a second copy at the load
        # peak), and FSDP and ZeRO-3 need one dtype throughout (axolotl skips it there too; TRL never calls it).
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(
            model,
            use_gradient_checkpointing=bool(args.activation_checkpointing),
            gradient_checkpointing_kwargs=args.activation_checkpointing_kwargs,
        )
    return model


def is_sharded_run() -> bool:
    """The launcher asked for sharded parameters: DeepSpeed ZeRO-3 (set up by SFTConfig) or FSDP."""
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    return is_deepspeed_zero3_enabled() or os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


def load_tokenizer(job: dict):
    from transformers import AutoTokenizer

    model_cfg = job.get("model") or {}
    tokenizer = AutoTokenizer.from_pretrained(
        model_cfg["name_or_path"],
        trust_remote_code=bool(model_cfg.get("trust_remote_code", False)),
        revision=model_cfg.get("revision") or None,
    )
    if tokenizer.pad_token is None:  # many base models ship without one; padding needs it
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def peft_config(job: dict):
    if job.get("method", "lora") not in ("lora", "qlora"):
        return None
    from peft import LoraConfig

    return LoraConfig(task_type="CAUSAL_LM", **(job.get("lora") or {}))
