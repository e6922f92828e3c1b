"""What one decoder layer keeps for its backward pass, measured on CPU, beside the memory model's term.

    .venv/bin/python bench/memory_probe.py

Builds tiny random-weight Llama models with the installed transformers (and PEFT's LoRA), runs one forward under
bf16 autocast as tunedeck's trainer does, and counts every tensor autograd saves for the backward pass once per
storage (torch.autograd.graph.saved_tensors_hooks). One layer's share is the difference between a 3-layer and a
2-layer model (the first layer keeps less: its input, the embeddings' output, needs no gradient). It prints bytes
per token of one layer, measured and as backend/estimate/memory_activations.py counts them, in units of the hidden size h.

The probe runs on CPU, where two things differ from CUDA: dropout keeps its mask in the input's dtype (fp32 after
PEFT's cast: 4 bytes) where CUDA's native_dropout keeps a 1-byte bool, and attention runs SDPA's CPU flash kernel,
which keeps q, k, v, the output and the log-sum-exp as CUDA's flash and efficient kernels do. The dropout rows
therefore print the mask difference beside the totals.

    .venv/bin/python bench/memory_probe.py --litgpt PATH

does the same for the layer of LitGPT's 2023 LoRA (the software of its resource tables, backend/estimate/memory_software.py:
litgpt-2023) from a lit_gpt source folder (Lightning-AI/lit-gpt at 8641822: `git archive 8641822 lit_gpt`), in
bf16 without autocast as bf16-true runs it, with attention keeping what CUDA's flash kernel keeps. What a layer keeps
depends on torch: before 2.2, mean(dim) saved its input (pytorch/pytorch#109876), so LitGPT's RMSNorm kept x * x
beside x. With torch 2.1.0, the resource tables' version (in a separate environment: pip install torch==2.1.0), the
layer keeps 44.3h bytes per token; with torch 2.13, 40.3h; litgpt-2023 counts torch 2.1.0's.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tunedeck.backend.estimate.memory_activations import _per_layer_activation_bytes  # noqa: E402
from tunedeck.backend.estimate.memory_job import Job, input_values  # noqa: E402
from tunedeck.backend.spec import JobSpec, set_paths  # noqa: E402

TOY = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 512,
    "intermediate_size": 1376,  # Llama-2's 11008/4096 ratio
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "vocab_size": 256,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-5,
}
TOKENS = 256
CASES = {  # name: (method, lora_dropout, target_modules)
    "full fine-tuning": ("full", 0.0, None),
    "LoRA q,v": ("lora", 0.0, ["q_proj", "v_proj"]),
    "LoRA all-linear": ("lora", 0.0, "all-linear"),
    "LoRA q,v, dropout 0.05": ("lora", 0.05, ["q_proj", "v_proj"]),
}


def saved_bytes(layers: int, method: str, dropout: float, targets) -> int:
    """Bytes autograd saves during one forward of a toy model of `layers` layers (each storage once)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**{**TOY, "num_hidden_layers": layers})
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    if method == "lora":
        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=dropout, target_modules=targets))
    model.train()
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage._cdata not in params:
            saved[storage._cdata] = storage.nbytes()
        return tensor

    ids = torch.randint(0, TOY["vocab_size"], (1, TOKENS))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
        model(input_ids=ids, labels=ids)
    return sum(saved.values())


def measured_layer_bytes(method: str, dropout: float, targets) -> float:
    """Bytes per token one decoder layer keeps, measured."""
    return (saved_bytes(3, method, dropout, targets) - saved_bytes(2, method, dropout, targets)) / TOKENS


def predicted_layer_bytes(method: str, dropout: float, targets, *, mask_bytes: int = 1) -> float:
    """Bytes per token of one layer as backend/estimate/memory_activations.py counts them (CUDA's 1-byte dropout mask;
    mask_bytes=4 counts the CPU's)."""
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps({**TOY, "num_hidden_layers": 3}), encoding="utf-8")
        settings = {"model.name_or_path": folder, "method": method, "dataset.max_seq_length": TOKENS}
        if method == "lora":
            settings.update({"lora.r": 8, "lora.lora_dropout": dropout, "lora.target_modules": targets})
        job = Job.from_values(input_values(set_paths(JobSpec(), settings)))
        per_layer = _per_layer_activation_bytes(job)
    if dropout > 0 and method == "lora":
        adapted = job.arch.adapted_weights(job.lora_targets)
        per_layer += (mask_bytes - 1) * sum(w.in_features for w in adapted)
    return per_layer


def litgpt_layer_bytes(source: Path) -> float:
    """Bytes per token one LitGPT LoRA layer (q and v, r 8, dropout 0.05) keeps, measured with the installed torch.
    Lightning is not needed: lit_gpt imports it only for names its model code does not use."""
    import types

    import torch
    import torch.nn.functional as F

    for name in ("lightning", "lightning.fabric", "lightning.fabric.strategies", "lightning.fabric.utilities"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["lightning"].Fabric = object
    sys.modules["lightning.fabric.strategies"].FSDPStrategy = object
    load = sys.modules.setdefault(
        "lightning.fabric.utilities.load", types.ModuleType("lightning.fabric.utilities.load")
    )
    load._lazy_load = None
    imports = types.ModuleType("lightning_utilities.core.imports")
    imports.RequirementCache = lambda requirement, *a: requirement.startswith("lightning")  # no flash-attn package
    for name in ("lightning_utilities", "lightning_utilities.core"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["lightning_utilities.core.imports"] = imports
    sys.path.insert(0, str(source.parent))
    sdpa = F.scaled_dot_product_attention

    class Flash(torch.autograd.Function):
        """What CUDA's flash kernel keeps for its backward: q, k, v, the output and an fp32 log-sum-exp."""

        @staticmethod
        def forward(ctx, q, k, v):
            with torch.no_grad():
                out = sdpa(q.float(), k.float(), v.float(), is_causal=True).to(q.dtype)
            ctx.save_for_backward(q, k, v, out, torch.empty(q.shape[:-1]))
            return out

    F.scaled_dot_product_attention = lambda q, k, v, *a, **kw: Flash.apply(q, k, v)
    from lit_gpt.lora import GPT, Config, mark_only_lora_as_trainable

    def saved(layers: int) -> int:
        torch.manual_seed(0)
        torch.set_default_dtype(torch.bfloat16)  # bf16-true builds the model in bf16
        config = Config(
            name="toy", block_size=4096, vocab_size=TOY["vocab_size"], padding_multiple=64, n_layer=layers,
            n_head=TOY["num_attention_heads"], n_embd=TOY["hidden_size"], rotary_percentage=1.0,
            parallel_residual=False, bias=False, _norm_class="RMSNorm", _mlp_class="LLaMAMLP",
            intermediate_size=TOY["intermediate_size"], r=8, alpha=16, dropout=0.05, to_query=True, to_value=True,
        )  # fmt: skip
        model = GPT(config)
        torch.set_default_dtype(torch.float32)
        model.max_seq_length = TOKENS  # finetune/lora.py sets it after building: an fp32 rope cache
        mark_only_lora_as_trainable(model)
        kept = {t.untyped_storage()._cdata for t in [*model.parameters(), *model.buffers()]}
        seen: dict[int, int] = {}

        def pack(tensor):
            storage = tensor.untyped_storage()
            if storage._cdata not in kept:
                seen[storage._cdata] = storage.nbytes()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(torch.randint(0, TOY["vocab_size"], (1, TOKENS)))
        return sum(seen.values())

    try:
        return (saved(3) - saved(2)) / TOKENS
    finally:
        F.scaled_dot_product_attention = sdpa


def litgpt_predicted_bytes(*, mask_bytes: int = 1, torch_2_1: bool = True) -> float:
    """One LitGPT 2023 layer as backend/estimate/memory_activations.py counts it (software litgpt-2023, torch 2.1.0's norms);
    mask_bytes=2 counts the CPU's dropout mask, torch_2_1=False a torch whose mean keeps nothing."""
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps({**TOY, "num_hidden_layers": 3}), encoding="utf-8")
        settings = {"model.name_or_path": folder, "method": "lora", "dataset.max_seq_length": TOKENS, "lora.r": 8,
                    "lora.lora_dropout": 0.05, "lora.target_modules": ["q_proj", "v_proj"]}  # fmt: skip
        job = Job.from_values(input_values(set_paths(JobSpec(), settings), software="litgpt-2023"))
        per_layer = _per_layer_activation_bytes(job)
    h = TOY["hidden_size"]
    norms = 0 if torch_2_1 else job.arch.norms_per_layer * job.software.norm_mean_input_bytes * h
    return per_layer + (mask_bytes - 1) * h - norms  # one dropout serves the fused qkv projection's input


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--litgpt":
        import torch

        h, measured = TOY["hidden_size"], litgpt_layer_bytes(Path(sys.argv[2]).resolve())
        old = torch.__version__ < "2.2"
        model = litgpt_predicted_bytes(mask_bytes=2, torch_2_1=old)
        print(f"one LitGPT 2023 LoRA layer (h={h}) under torch {torch.__version__}, bytes per token: measured "
              f"{measured / h:.2f}h, model {model / h:.2f}h with the CPU's 2-byte dropout mask "
              f"(litgpt-2023 on CUDA: {litgpt_predicted_bytes() / h:.2f}h, torch 2.1.0's norms)")  # fmt: skip
        return 0
    h = TOY["hidden_size"]
    print(f"one decoder layer of a toy Llama (h={h}), bytes per token, in units of h:")
    for name, (method, dropout, targets) in CASES.items():
        measured = measured_layer_bytes(method, dropout, targets)
        predicted = predicted_layer_bytes(method, dropout, targets)
        line = f"  {name:26s} measured {measured / h:6.2f}h   model {predicted / h:6.2f}h"
        if dropout:
            on_cpu = predicted_layer_bytes(method, dropout, targets, mask_bytes=4)
            line += f"   (model with the CPU's 4-byte mask: {on_cpu / h:.2f}h)"
        print(line)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
