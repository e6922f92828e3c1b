"""What a decoder model is, from its config.json's numbers alone: its layer's weight matrices as transformers 5
builds them (`layer_weights`), and what follows from them: exact parameter counts, what bitsandbytes quantizes,
the largest layer, and what PEFT's LoRA trains. The known models and the lookup are in backend/spec/catalog.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class Weight:
    """One weight matrix kind of a decoder layer: an nn.Linear, or a fused expert tensor."""

    name: str  # module name in transformers (what LoRA target_modules match)
    in_features: int
    out_features: int
    bias: bool = False
    copies: int = 1  # MoE experts stacked in one tensor
    is_linear: bool = True  # an nn.Linear: what bitsandbytes quantizes
    lora_rank_multiplier: int = 1  # PEFT's LoRA rank on this weight, in units of r

    @property
    def numel(self) -> int:
        return self.copies * (self.in_features * self.out_features + (self.out_features if self.bias else 0))

    def lora_params(self, r: int) -> int:
        return r * self.lora_rank_multiplier * (self.in_features + self.out_features)


@dataclass(frozen=True)
class ModelArch:
    model_type: str
    decoder_layer_cls: str
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    head_dim: int | None = None  # when not hidden_size / num_attention_heads (Gemma 2)
    attention_bias: bool = False  # q/k/v projections carry biases (Qwen2)
    num_local_experts: int = 0  # Mixtral-style mixture of experts
    num_experts_per_tok: int = 0
    final_logit_softcapping: float | None = None  # Gemma 2: tanh on the logits (one more vocab-sized tensor)
    source: str = ""  # the config.json the numbers come from

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_size

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_size

    @cached_property
    def layer_weights(self) -> tuple[Weight, ...]:
        """The weight matrices of one decoder layer, as transformers 5 builds the model type."""
        h, i = self.hidden_size, self.intermediate_size
        bias = self.attention_bias
        if self.model_type == "phi3":  # fused projections
            attention = [
                Weight("qkv_proj", h, self.q_size + 2 * self.kv_size),
                Weight("o_proj", self.q_size, h),
            ]
        else:
            attention = [
                Weight("q_proj", h, self.q_size, bias),
                Weight("k_proj", h, self.kv_size, bias),
                Weight("v_proj", h, self.kv_size, bias),
                Weight("o_proj", self.q_size, h),
            ]
        if self.num_local_experts:
            # transformers 5 stores the experts as stacked 3D parameters and the router as a plain
            # parameter: none is an nn.Linear, so bitsandbytes leaves them in 16 bits. PEFT 0.21's
            # "all-linear" still adapts them: the router like a linear layer, each stacked tensor
            # through a ParamWrapper of rank r x experts (x 2 for the fused gate/up projection).
            e = self.num_local_experts
            mlp = [
                Weight("gate", h, e, is_linear=False),
                Weight("experts.gate_up_proj", h, 2 * i, copies=e, is_linear=False, lora_rank_multiplier=2 * e),
                Weight("experts.down_proj", i, h, copies=e, is_linear=False, lora_rank_multiplier=e),
            ]
        elif self.model_type == "phi3":
            mlp = [Weight("gate_up_proj", h, 2 * i), Weight("down_proj", i, h)]
        else:
            mlp = [Weight("gate_proj", h, i), Weight("up_proj", h, i), Weight("down_proj", i, h)]
        return tuple(attention + mlp)

    @property
    def norms_per_layer(self) -> int:
        # Gemma 2 adds pre/post feed-forward norms; Qwen3 normalises q and k per head.
        return 4 if self.model_type == "gemma2" else 2

    @property
    def layer_norm_params(self) -> int:
        extra = 2 * self.head_size if self.model_type == "qwen3" else 0
        return self.norms_per_layer * self.hidden_size + extra

    @property
    def layer_params(self) -> int:
        return sum(w.numel for w in self.layer_weights) + self.layer_norm_params

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def head_params(self) -> int:
        """The output projection (lm_head), 0 when it shares the input embedding."""
        return 0 if self.tie_word_embeddings else self.embedding_params

    @cached_property
    def num_parameters(self) -> int:
        """Exact count, as sum(p.numel() for p in model.parameters()) reports it (tied weights once)."""
        final_norm = self.hidden_size
        return self.embedding_params + self.num_hidden_layers * self.layer_params + final_norm + self.head_params

    @property
    def linear_params(self) -> int:
        """Weights (not biases) of the decoder layers' nn.Linear modules: what bitsandbytes quantizes."""
        per_layer = sum(w.copies * w.in_features * w.out_features for w in self.layer_weights if w.is_linear)
        return self.num_hidden_layers * per_layer

    @property
    def largest_layer_params(self) -> int:
        """The biggest module's own parameters (DeepSpeed's model_to_params: largest_layer_params)."""
        experts = sum(w.numel for w in self.layer_weights if w.copies > 1)
        return max([self.embedding_params, experts] + [w.numel for w in self.layer_weights])

    def adapted_weights(self, target_modules: str | Iterable[str]) -> list[Weight]:
        """Weights of one layer that PEFT wraps with LoRA for these target_modules.

        "all-linear" is every linear layer except the output layer (lm_head), as PEFT resolves it.
        """
        if target_modules == "all-linear":
            return list(self.layer_weights)
        names = {target_modules} if isinstance(target_modules, str) else set(target_modules)
        return [w for w in self.layer_weights if w.name in names]

    def lora_trainable(self, r: int, target_modules: str | Iterable[str], use_dora: bool = False) -> int:
        """Trainable parameters PEFT's get_peft_model creates (bias="none")."""
        per_layer = 0
        for w in self.adapted_weights(target_modules):
            per_layer += w.lora_params(r)
            if use_dora:
                per_layer += w.out_features  # the magnitude vector
        return self.num_hidden_layers * per_layer
