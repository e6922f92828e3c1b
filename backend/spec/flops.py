"""FLOPs of a training step, and the peak dense throughput of GPUs: what MFU is measured against.

One formula for the two sides of the speed question: train.py (shipped alone as train_sft.py)
divides the FLOPs of the tokens it trained by the time they took and the GPU's peak (MFU), and
the estimator (backend/estimate/speed.py) divides the FLOPs of a step by an efficiency to predict its
time. train.py cannot import tunedeck, so it carries a verbatim copy of the block between the
SHARED markers below; tests/estimate/test_flops.py fails when the two differ, and
`python -m tunedeck.backend.spec.flops --sync` rewrites train.py's copy. The block uses no imports.

FLOPs per token (PaLM, Chowdhery et al. 2022, appendix B, https://arxiv.org/abs/2204.02311):
a matmul weight of N elements costs 2N FLOPs per token forward, 2N backward for the input's
gradient and 2N for the weight's gradient: 6N for a trained model. Under LoRA the frozen base
needs no weight gradients (Hu et al. 2021, https://arxiv.org/abs/2106.09685): 4N + 2N_trainable
(plus the adapters' own 6 x their size, folded into N_trainable). Attention's score and value
matmuls add 12 x layers x (heads x head_dim) x T per token for fwd+bwd at sequence length T
(PaLM's convention: the causal mask is not halved). N counts the weights tokens are multiplied
by: every decoder layer's linear weights (for a mixture of experts, the experts a token is
routed to) and the output head; the input embedding is a lookup and costs nothing.
Activation checkpointing recomputes each layer's forward in the backward pass: those FLOPs
count in hardware FLOPs (HFU) and never in model FLOPs (MFU), as Megatron-LM separates them
(Korthikanti et al. 2022, https://arxiv.org/abs/2205.05198, section 6).
"""

from __future__ import annotations

import sys
from pathlib import Path

# >>> SHARED with backend/recipe/train.py (a verbatim copy there; edit here, then --sync)
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


# Per trained token, the forward passes without gradients of an objective (TRL's trainers), by its reference and
# by the model itself, and the sequences of a row its token count covers: DPO's reference scores the chosen and
# the rejected answer (two sequences a row, both counted); KTO's reference scores the answer and a mismatched
# answer for the KL estimate, which the model scores too (the KL answers are not counted as tokens). GRPO's model
# writes its answers first, a forward a token (with the KV cache; the prompt once); a KL weight (grpo.beta > 0)
# adds a reference pass, counted by extra_forwards, not here: without one GRPO has no reference.
OBJECTIVE_PASSES = {"sft": (0, 0, 1), "dpo": (1, 0, 2), "kto": (2, 1, 1), "grpo": (0, 1, 1)}
# The objectives that always score against a reference (the base with the adapters off, or a frozen copy of it).
REFERENCE_OBJECTIVES = tuple(objective for objective, (reference, _, _) in OBJECTIVE_PASSES.items() if reference)


def extra_forwards(objective: str, precomputed: bool = False, kl_reference: bool = False) -> int:
    """Forward passes without gradients per trained token: the model's own, and the reference's unless its scores
    were computed once before training (preference.precompute_ref_log_probs); kl_reference: GRPO's KL reference."""
    reference, own, _ = OBJECTIVE_PASSES[objective]
    return own + (0 if precomputed else reference) + int(kl_reference)


def sequences_per_row(objective: str) -> int:
    return OBJECTIVE_PASSES[objective][2]


def flops_per_token(
    matmul_params,
    trainable_params,
    layers,
    attention_width,
    seq_len,
    full,
    checkpointing,
    layer_matmul_params=None,
    extra_forwards=0,
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


# <<< SHARED


def arch_matmul_params(arch) -> tuple[int, int]:
    """(matmul params per token, of which in the decoder layers) of a catalog.ModelArch."""
    per_layer = 0
    for w in arch.layer_weights:
        active = w.copies
        if w.copies > 1 and arch.num_experts_per_tok:  # a token runs through its routed experts only
            active = arch.num_experts_per_tok
        per_layer += active * w.in_features * w.out_features
    layers = arch.num_hidden_layers * per_layer
    return layers + arch.vocab_size * arch.hidden_size, layers


def arch_flops_per_token(
    arch, trainable: int, seq_len: int, full: bool, checkpointing: bool, extra_forwards: int = 0
) -> tuple[float, float]:
    """flops_per_token for a catalog.ModelArch."""
    matmul, layer_matmul = arch_matmul_params(arch)
    return flops_per_token(
        matmul,
        trainable,
        arch.num_hidden_layers,
        arch.q_size,
        seq_len,
        full,
        checkpointing,
        layer_matmul,
        extra_forwards,
    )


# ---------------------------------------------------------------- keeping train.py's copy in step

BEGIN, END = "# >>> SHARED", "# <<< SHARED"
TRAIN_FILE = Path(__file__).resolve().parent.parent / "recipe" / "train.py"


def shared_block(text: str) -> str:
    """The lines from the BEGIN marker to the END marker, both included."""
    start = text.index(BEGIN)
    start = text.rfind("\n", 0, start) + 1
    end = text.index("\n", text.index(END)) + 1
    return text[start:end]


def synced_train_text(train_text: str) -> str:
    own = shared_block(Path(__file__).read_text(encoding="utf-8"))
    return train_text.replace(shared_block(train_text), own)


if __name__ == "__main__" and sys.argv[1:] == ["--sync"]:
    TRAIN_FILE.write_text(synced_train_text(TRAIN_FILE.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"{TRAIN_FILE}: shared block rewritten from {__file__}")
