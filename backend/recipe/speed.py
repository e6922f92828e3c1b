"""How fast: MFU and HFU from the FLOPs of the tokens trained and the GPU's peak (the GPU table).

Model FLOPs utilisation: the FLOPs of the tokens trained (forward + backward, backend/spec/flops.py
explains the formula) per second, over the GPU's peak dense throughput for the compute dtype.
HFU adds the forward passes activation checkpointing recomputes. Without a known peak (a CPU
run, a GPU missing from the table) there is no MFU: the start record says why instead.
"""

from __future__ import annotations

import os

from .objectives import extra_forwards, sequences_per_row
from .ranks import _world_size

# Peak dense (no sparsity) tensor throughput in TFLOPS per GPU and compute dtype, with memory
# in GB and the page each number comes from. Rows are matched against the NVML device name
# (torch.cuda.get_device_name gives the same) in order: the more specific rows first.
# (key, words the normalised name must all contain, memory GB, SXM board (NVLink between GPUs),
#  {dtype: TFLOPS}, source)
GPU_TABLE = (
    ("H200 NVL", ("H200", "NVL"), 141, False, {"bf16": 835, "fp16": 835, "tf32": 418, "fp32": 60},
     "https://www.nvidia.com/en-us/data-center/h200/"),
    ("H200", ("H200",), 141, True, {"bf16": 989, "fp16": 989, "tf32": 494, "fp32": 67},
     "https://www.nvidia.com/en-us/data-center/h200/"),
    ("H100 NVL", ("H100", "NVL"), 94, False, {"bf16": 835, "fp16": 835, "tf32": 418, "fp32": 60},
     "https://www.nvidia.com/en-us/data-center/h100/"),
    ("H100 PCIe", ("H100", "PCIE"), 80, False, {"bf16": 756, "fp16": 756, "tf32": 378, "fp32": 51},
     "https://www.nvidia.com/en-us/data-center/h100/"),
    ("H100", ("H100",), 80, True, {"bf16": 989, "fp16": 989, "tf32": 494, "fp32": 67},
     "https://www.nvidia.com/en-us/data-center/h100/"),
    ("A100-40GB", ("A100", "40GB"), 40, True, {"bf16": 312, "fp16": 312, "tf32": 156, "fp32": 19.5},
     "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"),
    ("A100-80GB", ("A100",), 80, True, {"bf16": 312, "fp16": 312, "tf32": 156, "fp32": 19.5},
     "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"),
    ("A10G", ("A10G",), 24, False, {"bf16": 70, "fp16": 70, "tf32": 35, "fp32": 35},
     "https://d1.awsstatic.com/product-marketing/ec2/NVIDIA_AWS_A10G_DataSheet_FINAL_02_17_2022.pdf"),
    ("A10", ("A10",), 24, False, {"bf16": 125, "fp16": 125, "tf32": 62.5, "fp32": 31.2},
     "https://www.nvidia.com/en-us/data-center/products/a10-gpu/"),
    ("L40S", ("L40S",), 48, False, {"bf16": 362, "fp16": 362, "tf32": 183, "fp32": 91.6},
     "https://www.nvidia.com/en-us/data-center/l40s/"),
    ("L40", ("L40",), 48, False, {"bf16": 181, "fp16": 181, "tf32": 90.5, "fp32": 90.5},
     "https://www.nvidia.com/en-us/data-center/l40/"),
    ("L4", ("L4",), 24, False, {"bf16": 121, "fp16": 121, "tf32": 60, "fp32": 30.3},
     "https://www.nvidia.com/en-us/data-center/l4/"),
    # GeForce: tensor throughput with FP32 accumulation, which PyTorch's bf16/fp16 matmuls use
    # (the headline figures accumulate in FP16 and are twice these).
    ("RTX 4090", ("RTX4090",), 24, False, {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6},
     "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"),
    ("RTX 3090", ("RTX3090",), 24, False, {"bf16": 71, "fp16": 71, "tf32": 35.6, "fp32": 35.6},
     "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf"),
    ("RTX 6000 Ada", ("RTX6000ADA",), 48, False, {"bf16": 364.2, "fp16": 364.2, "tf32": 182.1, "fp32": 91.1},
     "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"),
    ("A6000", ("A6000",), 48, False, {"bf16": 154.8, "fp16": 154.8, "tf32": 77.4, "fp32": 38.7},
     "https://www.nvidia.com/content/dam/en-zz/Solutions/design-visualization/quadro-product-literature/proviz-print-nvidia-rtx-a6000-datasheet-us-nvidia-1454980-r9-web%20(1).pdf"),
    # Volta has no bf16 units: a bf16 job there has no peak to compare with.
    ("V100-16GB", ("V100", "16GB"), 16, True, {"fp16": 125, "fp32": 15.7},
     "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"),
    ("V100", ("V100",), 32, True, {"fp16": 125, "fp32": 15.7},
     "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"),
    ("T4", ("T4",), 16, False, {"fp16": 65, "fp32": 8.1},
     "https://www.nvidia.com/en-us/data-center/tesla-t4/"),
)  # fmt: skip

PEAK_ENV = "TUNEDECK_PEAK_TFLOPS"  # a peak to measure against where the table has none (tests, new GPUs)


def normalise_gpu_name(name):
    """'NVIDIA GeForce RTX 4090' -> 'RTX4090', 'NVIDIA A100-SXM4-80GB' -> 'A100SXM480GB'."""
    text = str(name).upper()
    for word in ("NVIDIA", "GEFORCE", "TESLA", "QUADRO", " ", "-", "_"):
        text = text.replace(word, "")
    return text


def gpu_row(name):
    """The GPU_TABLE row of an NVML name or a typed one ('A100-80GB', 'RTX 4090'), or None."""
    text = normalise_gpu_name(name)
    for row in GPU_TABLE:
        if all(word in text for word in row[1]):
            return row
    return None


def peak_tflops(name, dtype):
    """(TFLOPS, source) of a GPU for a compute dtype (bf16, fp16, tf32, fp32), or (None, why not)."""
    row = gpu_row(name)
    if row is None:
        return None, f"{name!r} is not in tunedeck's GPU table (set {PEAK_ENV} to its peak in TFLOPS)"
    tflops = row[4].get(dtype)
    if tflops is None:
        return None, f"{row[0]} has no {dtype} tensor units in its datasheet"
    return float(tflops), row[5]


def flops_per_token(
    matmul_params,
    trainable_params,
    layers,
    attention_width,
    seq_len,
    full,
    checkpointing,
    layer_matmul_params=None,
    extra_forwards: float = 0,
):
    """(model FLOPs, hardware FLOPs) per trained token of one training step (forward + backward).

    matmul_params: weights a token is multiplied by (decoder linears, routed experts, the head);
    trainable_params: the weights that get gradients (all of them when full); attention_width:
    heads x head_dim; seq_len: the tokens each sequence attends over; checkpointing: activation
    checkpointing recomputes every layer's forward (layer_matmul_params: the decoder layers'
    share of matmul_params, default all of it); extra_forwards: the forward passes without gradients per
    token that the objective adds (extra_forwards: DPO's reference model, or the base with the adapters off).
    """
    weight_grads = matmul_params if full else trainable_params
    attention = 4 * layers * attention_width * seq_len  # forward: QK^T and AV, 2 FLOPs per multiply-add
    model = 4 * matmul_params + 2 * weight_grads + 3 * attention
    model += extra_forwards * (2 * matmul_params + attention)
    hardware = model
    if checkpointing:
        recomputed = matmul_params if layer_matmul_params is None else layer_matmul_params
        hardware += 2 * recomputed + attention
    return float(model), float(hardware)


def speed_facts(trainer, trainable: int, total: int, objective: str = "sft") -> dict:
    """What MFU needs, for the start record: the GPU, its peak for the compute dtype, the FLOP inputs."""
    import torch

    model, args = trainer.model, trainer.args
    config = getattr(model, "config", None)
    linears = {}  # module name -> in x out, for every matmul a token goes through (LoRA's own included)
    for name, module in model.named_modules():
        leaf = next(module.children(), None) is None  # not PEFT's wrapper around the base layer: counted once
        if leaf and hasattr(module, "in_features") and hasattr(module, "out_features"):
            linears[name] = int(module.in_features) * int(module.out_features)
    head = sum(n for name, n in linears.items() if name.endswith("lm_head"))
    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    head_dim = getattr(config, "head_dim", None) or (int(getattr(config, "hidden_size", 0)) // max(1, heads))
    checkpointing = bool(args.gradient_checkpointing)
    fsdp_plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None)
    if fsdp_plugin is not None and getattr(fsdp_plugin, "activation_checkpointing", False):
        checkpointing = True
    if args.bf16:
        dtype = "bf16"
    elif args.fp16:
        dtype = "fp16"
    else:
        loaded = getattr(model, "dtype", None)
        dtype = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(loaded) if loaded is not None else None
        dtype = dtype or ("tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32")
    gpu = torch.cuda.get_device_name(args.device) if torch.cuda.is_available() and args.device.type == "cuda" else None
    facts = {
        "gpu_name": gpu,
        "compute_dtype": dtype,
        "flops_inputs": {
            "matmul_params": sum(linears.values()),
            "layer_matmul_params": sum(linears.values()) - head,
            "trainable_params": trainable,
            "layers": int(getattr(config, "num_hidden_layers", 0) or 0),
            "attention_width": heads * int(head_dim),
            "full": trainable >= total,  # every weight gets its gradient
            "checkpointing": checkpointing,
            # the objective's passes without gradients per token, and the sequences a row's token count covers
            "extra_forwards": extra_forwards(
                objective,
                getattr(args, "precompute_ref_log_probs", False),
                kl_reference=objective == "grpo" and getattr(args, "beta", 0) > 0,
            ),
            "sequences_per_row": sequences_per_row(objective),
        },
    }
    peak, source = None, f"this run computes on {args.device.type.upper()}, not a GPU with a published peak"
    override = os.environ.get(PEAK_ENV)
    if override:  # a typo must not stop a training run: it says why there is no MFU instead
        peak = _tflops(override)
        source = PEAK_ENV if peak else f"{PEAK_ENV}={override!r} is not a number of TFLOPS"
    elif gpu is not None:
        peak, source = peak_tflops(gpu, dtype)
    facts["peak_tflops"] = peak
    if peak:
        facts["peak_source"] = source
    else:
        facts["mfu_note"] = f"MFU is not defined without a known peak: {source} (set {PEAK_ENV} to measure against one)"
    return facts


def _tflops(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 < value < 1e7 else None  # also refuses nan and inf


def utilisation(facts: dict, tokens_per_second: float, seq_len: float) -> dict:
    """{"mfu", "hfu"} of a logging window (tokens/s of all ranks together), or {} without a peak."""
    peak = facts.get("peak_tflops")
    if not peak or tokens_per_second <= 0:
        return {}
    f = facts["flops_inputs"]
    model, hardware = flops_per_token(
        f["matmul_params"],
        f["trainable_params"],
        f["layers"],
        f["attention_width"],
        seq_len,
        f["full"],
        f["checkpointing"],
        f["layer_matmul_params"],
        f.get("extra_forwards", 0),
    )
    per_gpu = tokens_per_second / max(1, _world_size())
    return {"mfu": per_gpu * model / (peak * 1e12), "hfu": per_gpu * hardware / (peak * 1e12)}
