"""Architecture facts of well-known models, and of local model folders (config.json).

Interface used across the project (keep it stable):
    lookup(name_or_path) -> ModelArch | None
    ModelArch.decoder_layer_cls, .hidden_size, .num_hidden_layers, ...
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


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


_LLAMA2_7B = ModelArch("llama", "LlamaDecoderLayer", 32, 4096, 32, 32, 11008, 32000)
_LLAMA2_13B = ModelArch("llama", "LlamaDecoderLayer", 40, 5120, 40, 40, 13824, 32000)
_LLAMA2_70B = ModelArch("llama", "LlamaDecoderLayer", 80, 8192, 64, 8, 28672, 32000)

KNOWN: dict[str, ModelArch] = {
    "meta-llama/Llama-2-7b-hf": _LLAMA2_7B,
    "meta-llama/Llama-2-13b-hf": _LLAMA2_13B,
    "meta-llama/Llama-2-70b-hf": _LLAMA2_70B,
}

# model_type in config.json -> decoder layer class, for local folders.
DECODER_LAYER_BY_MODEL_TYPE = {
    "llama": "LlamaDecoderLayer",
    "mistral": "MistralDecoderLayer",
    "mixtral": "MixtralDecoderLayer",
    "qwen2": "Qwen2DecoderLayer",
    "gemma2": "Gemma2DecoderLayer",
    "phi3": "Phi3DecoderLayer",
}


def from_config(config: dict) -> ModelArch | None:
    model_type = config.get("model_type", "")
    layer = DECODER_LAYER_BY_MODEL_TYPE.get(model_type)
    if layer is None:
        return None
    heads = config["num_attention_heads"]
    return ModelArch(
        model_type=model_type,
        decoder_layer_cls=layer,
        num_hidden_layers=config["num_hidden_layers"],
        hidden_size=config["hidden_size"],
        num_attention_heads=heads,
        num_key_value_heads=config.get("num_key_value_heads") or heads,
        intermediate_size=config["intermediate_size"],
        vocab_size=config["vocab_size"],
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
    )


def lookup(name_or_path: str) -> ModelArch | None:
    """Facts for a hub id we know, or a local folder with a config.json; None otherwise."""
    if name_or_path in KNOWN:
        return KNOWN[name_or_path]
    config_file = Path(name_or_path) / "config.json"
    if config_file.is_file():
        return from_config(json.loads(config_file.read_text(encoding="utf-8")))
    return None
