"""FLOPs of a training step, and the peak dense throughput of GPUs: what MFU is measured against.

One formula for the two sides of the speed question: the recipe (backend/recipe/speed.py, shipped in every
bundle) divides the FLOPs of the tokens it trained by the time they took and the GPU's peak (MFU), and
the estimator (backend/estimate/speed.py) divides the FLOPs of a step by an efficiency to predict its
time. The formula and the GPU table are the recipe's; this module adds what the estimate needs of a model
architecture from the catalog.

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

# The GPU table and the formula live in the recipe, which every run carries (MFU in its log records) and
# tunedeck imports: one copy.
from tunedeck.backend.recipe.objectives import OBJECTIVE_PASSES, REFERENCE_OBJECTIVES, extra_forwards, sequences_per_row
from tunedeck.backend.recipe.speed import GPU_TABLE, PEAK_ENV, flops_per_token, gpu_row, normalise_gpu_name, peak_tflops

# What the estimate and the panel read here: the recipe's formula and table, and the architecture's FLOPs below.
__all__ = [
    "GPU_TABLE", "OBJECTIVE_PASSES", "PEAK_ENV", "REFERENCE_OBJECTIVES", "arch_flops_per_token", "arch_matmul_params",
    "extra_forwards", "flops_per_token", "gpu_row", "normalise_gpu_name", "peak_tflops", "sequences_per_row",
]  # fmt: skip


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
    arch, trainable: int, seq_len: int, full: bool, checkpointing: bool, extra_forwards: float = 0
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
