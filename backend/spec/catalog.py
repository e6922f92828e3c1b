"""Architecture facts of well-known models, and of local model folders (config.json).

Interface used across the project (keep it stable):
    lookup(name_or_path) -> ModelArch | None
    ModelArch.decoder_layer_cls, .hidden_size, .num_hidden_layers, ...
    ModelArch.num_parameters            exact parameter count, no weights needed
    ModelArch.lora_trainable(r, target_modules)   what PEFT would train

Every number in KNOWN is copied from the model's published config.json on the
Hugging Face hub (the URL is in `source`). What follows from the numbers (the weight
matrices of one decoder layer, parameter counts, LoRA counts, quantized bytes, the largest
layer) is ModelArch's, in backend/spec/model_arch.py. The tests build each family on
PyTorch's meta device and compare counts.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path

from tunedeck.backend.spec.model_arch import ModelArch


def _llama(layers, hidden, heads, kv_heads, intermediate, vocab, tied=False, *, source, **extra) -> ModelArch:
    return ModelArch(
        "llama", "LlamaDecoderLayer", layers, hidden, heads, kv_heads, intermediate, vocab, tied, source=source, **extra
    )


def _hub(repo: str) -> str:
    return f"https://huggingface.co/{repo}/blob/main/config.json"


_LLAMA2_7B = _llama(32, 4096, 32, 32, 11008, 32000, source=_hub("meta-llama/Llama-2-7b-hf"))
_LLAMA2_13B = _llama(40, 5120, 40, 40, 13824, 32000, source=_hub("meta-llama/Llama-2-13b-hf"))
_LLAMA2_70B = _llama(80, 8192, 64, 8, 28672, 32000, source=_hub("meta-llama/Llama-2-70b-hf"))
_LLAMA3_8B = _llama(32, 4096, 32, 8, 14336, 128256, source=_hub("meta-llama/Meta-Llama-3-8B"))
_LLAMA3_70B = _llama(80, 8192, 64, 8, 28672, 128256, source=_hub("meta-llama/Meta-Llama-3-70B"))
_LLAMA32_1B = _llama(16, 2048, 32, 8, 8192, 128256, True, head_dim=64, source=_hub("meta-llama/Llama-3.2-1B"))
_LLAMA32_3B = _llama(28, 3072, 24, 8, 8192, 128256, True, head_dim=128, source=_hub("meta-llama/Llama-3.2-3B"))
_YI_34B = _llama(60, 7168, 56, 8, 20480, 64000, source=_hub("01-ai/Yi-34B"))


def _mistral(vocab: int, repo: str) -> ModelArch:
    return ModelArch("mistral", "MistralDecoderLayer", 32, 4096, 32, 8, 14336, vocab, source=_hub(repo))


_MIXTRAL_8X7B = ModelArch(
    "mixtral",
    "MixtralDecoderLayer",
    32,
    4096,
    32,
    8,
    14336,
    32000,
    num_local_experts=8,
    num_experts_per_tok=2,
    source=_hub("mistralai/Mixtral-8x7B-v0.1"),
)


def _qwen25(layers, hidden, heads, kv_heads, intermediate, vocab, tied, size) -> ModelArch:
    return ModelArch(
        "qwen2",
        "Qwen2DecoderLayer",
        layers,
        hidden,
        heads,
        kv_heads,
        intermediate,
        vocab,
        tied,
        attention_bias=True,
        source=_hub(f"Qwen/Qwen2.5-{size}"),
    )


def _qwen3(layers, hidden, heads, intermediate, tied, size) -> ModelArch:
    # Every Qwen3 dense model: 8 kv heads of 128, no q/k/v bias, q and k normalised per head.
    return ModelArch(
        "qwen3",
        "Qwen3DecoderLayer",
        layers,
        hidden,
        heads,
        8,
        intermediate,
        151936,
        tied,
        head_dim=128,
        source=_hub(f"Qwen/Qwen3-{size}"),
    )


def _gemma2(layers, hidden, heads, kv_heads, head_dim, intermediate, size) -> ModelArch:
    return ModelArch(
        "gemma2",
        "Gemma2DecoderLayer",
        layers,
        hidden,
        heads,
        kv_heads,
        intermediate,
        256000,
        True,
        head_dim=head_dim,
        final_logit_softcapping=30.0,
        source=_hub(f"google/gemma-2-{size}"),
    )


def _phi3(layers, hidden, heads, kv_heads, intermediate, repo) -> ModelArch:
    return ModelArch(
        "phi3", "Phi3DecoderLayer", layers, hidden, heads, kv_heads, intermediate, 32064, source=_hub(repo)
    )


_QWEN = {
    "0.5B": _qwen25(24, 896, 14, 2, 4864, 151936, True, "0.5B"),
    "1.5B": _qwen25(28, 1536, 12, 2, 8960, 151936, True, "1.5B"),
    "3B": _qwen25(36, 2048, 16, 2, 11008, 151936, True, "3B"),
    "7B": _qwen25(28, 3584, 28, 4, 18944, 152064, False, "7B"),
    "14B": _qwen25(48, 5120, 40, 8, 13824, 152064, False, "14B"),
    "32B": _qwen25(64, 5120, 40, 8, 27648, 152064, False, "32B"),
    "72B": _qwen25(80, 8192, 64, 8, 29568, 152064, False, "72B"),
}
_QWEN3 = {
    "0.6B": _qwen3(28, 1024, 16, 3072, True, "0.6B"),
    "1.7B": _qwen3(28, 2048, 16, 6144, True, "1.7B"),
    "4B": _qwen3(36, 2560, 32, 9728, True, "4B"),
    "8B": _qwen3(36, 4096, 32, 12288, False, "8B"),
    "14B": _qwen3(40, 5120, 40, 17408, False, "14B"),
    "32B": _qwen3(64, 5120, 64, 25600, False, "32B"),
}
_GEMMA2 = {
    "2b": _gemma2(26, 2304, 8, 4, 256, 9216, "2b"),
    "9b": _gemma2(42, 3584, 16, 8, 256, 14336, "9b"),
    "27b": _gemma2(46, 4608, 32, 16, 128, 36864, "27b"),
}
_PHI3_MINI = _phi3(32, 3072, 32, 32, 8192, "microsoft/Phi-3-mini-4k-instruct")
_PHI3_MEDIUM = _phi3(40, 5120, 40, 10, 17920, "microsoft/Phi-3-medium-4k-instruct")


def _with_variants(base: dict[str, ModelArch]) -> dict[str, ModelArch]:
    # Chat/instruct checkpoints share their base model's architecture.
    out = dict(base)
    for name, arch in base.items():
        if name.endswith("-hf"):
            out[name.replace("-hf", "-chat-hf")] = arch
        elif not name.endswith("-Instruct"):
            out[f"{name}-Instruct"] = arch
    return out


KNOWN: dict[str, ModelArch] = _with_variants(
    {
        "meta-llama/Llama-2-7b-hf": _LLAMA2_7B,
        "meta-llama/Llama-2-13b-hf": _LLAMA2_13B,
        "meta-llama/Llama-2-70b-hf": _LLAMA2_70B,
        "meta-llama/Meta-Llama-3-8B": _LLAMA3_8B,
        "meta-llama/Meta-Llama-3-70B": _LLAMA3_70B,
        "meta-llama/Llama-3.1-8B": _LLAMA3_8B,  # 3.1 changes rope scaling and context only
        "meta-llama/Llama-3.1-70B": _LLAMA3_70B,
        "meta-llama/Meta-Llama-3.1-8B": _LLAMA3_8B,  # the 3.1 repositories' first names, still redirected
        "meta-llama/Meta-Llama-3.1-70B": _LLAMA3_70B,
        "meta-llama/Llama-3.2-1B": _LLAMA32_1B,
        "meta-llama/Llama-3.2-3B": _LLAMA32_3B,
        "meta-llama/Llama-3.3-70B-Instruct": _LLAMA3_70B,
        "mistralai/Mistral-7B-v0.1": _mistral(32000, "mistralai/Mistral-7B-v0.1"),
        "mistralai/Mistral-7B-v0.3": _mistral(32768, "mistralai/Mistral-7B-v0.3"),
        "mistralai/Mixtral-8x7B-v0.1": _MIXTRAL_8X7B,
        **{f"Qwen/Qwen2.5-{size}": arch for size, arch in _QWEN.items()},
        **{f"Qwen/Qwen3-{size}": arch for size, arch in _QWEN3.items()},  # Qwen3's chat models carry no suffix
        **{f"google/gemma-2-{size}": arch for size, arch in _GEMMA2.items()},
        "microsoft/Phi-3-mini-4k-instruct": _PHI3_MINI,
        "microsoft/Phi-3-medium-4k-instruct": _PHI3_MEDIUM,
        "01-ai/Yi-34B": _YI_34B,
    }
)
KNOWN["mistralai/Mistral-7B-Instruct-v0.2"] = _mistral(32000, "mistralai/Mistral-7B-Instruct-v0.2")
KNOWN["mistral-community/Mistral-7B-v0.2"] = _mistral(32000, "mistral-community/Mistral-7B-v0.2")  # v0.2's base
KNOWN["mistralai/Mistral-7B-Instruct-v0.3"] = KNOWN["mistralai/Mistral-7B-v0.3"]
KNOWN["mistralai/Mixtral-8x7B-Instruct-v0.1"] = _MIXTRAL_8X7B
for _size in _GEMMA2:
    KNOWN[f"google/gemma-2-{_size}-it"] = _GEMMA2[_size]

# model_type in config.json -> decoder layer class, for local folders.
DECODER_LAYER_BY_MODEL_TYPE = {
    "llama": "LlamaDecoderLayer",
    "mistral": "MistralDecoderLayer",
    "mixtral": "MixtralDecoderLayer",
    "qwen2": "Qwen2DecoderLayer",
    "qwen3": "Qwen3DecoderLayer",
    "gemma2": "Gemma2DecoderLayer",
    "phi3": "Phi3DecoderLayer",
}


def from_config(config: dict, source: str = "") -> ModelArch | None:
    """Facts from a config.json dict; None for a model type whose layout tunedeck does not know."""
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
        tie_word_embeddings=bool(config.get("tie_word_embeddings", model_type == "gemma2")),
        head_dim=config.get("head_dim"),
        attention_bias=bool(config.get("attention_bias", model_type == "qwen2")),
        num_local_experts=config.get("num_local_experts", 0) if model_type == "mixtral" else 0,
        num_experts_per_tok=config.get("num_experts_per_tok", 0) if model_type == "mixtral" else 0,
        final_logit_softcapping=config.get("final_logit_softcapping"),
        source=source,
    )


# Hub ids are case-insensitive, and people often type a model's name without its organisation.
_BY_LOWER = {name.lower(): arch for name, arch in KNOWN.items()}
_BY_BASENAME = {name.rpartition("/")[2].lower(): arch for name, arch in KNOWN.items()}


def lookup(name_or_path: str) -> ModelArch | None:
    """Facts for a hub id we know, a local folder with a config.json, or a hub id in the local
    Hugging Face cache (what `from_pretrained` downloaded before); None otherwise."""
    if name_or_path in KNOWN:
        return KNOWN[name_or_path]
    known = _BY_LOWER.get(name_or_path.lower()) or (
        None if "/" in name_or_path else _BY_BASENAME.get(name_or_path.lower())
    )
    if known is not None:
        return known
    config_file = Path(name_or_path) / "config.json"
    if not config_file.is_file():
        config_file = cached_config(name_or_path) or config_file
    try:
        mtime = config_file.stat().st_mtime_ns
    except OSError:
        return None
    return _read_local(str(config_file), mtime)


def hub_cache_dir() -> Path:
    """Where huggingface_hub keeps downloads: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface"
    return Path(home) / "hub"


def cached_config(repo_id: str) -> Path | None:
    """config.json of a hub model in the local cache (models--org--name/snapshots/<revision>/), the
    revision refs/main names first; None when it was never downloaded here."""
    if repo_id.count("/") != 1 or ".." in repo_id:
        return None
    folder = hub_cache_dir() / ("models--" + repo_id.replace("/", "--"))
    try:
        revision = (folder / "refs" / "main").read_text(encoding="utf-8").strip()
    except OSError:
        revision = ""
    candidates = [folder / "snapshots" / revision / "config.json"] if revision else []
    candidates += sorted(folder.glob("snapshots/*/config.json"))
    return next((c for c in candidates if c.is_file()), None)


@lru_cache(maxsize=64)
def _read_local(config_file: str, mtime_ns: int) -> ModelArch | None:
    # Keyed on the modification time: the panel asks on every form change, the file rarely changes.
    try:
        config = json.loads(Path(config_file).read_text(encoding="utf-8"))
        return from_config(config, source=config_file)
    except (OSError, ValueError, KeyError, TypeError):
        return None  # unreadable or incomplete config: treated as an unknown model
