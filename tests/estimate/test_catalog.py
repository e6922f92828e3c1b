"""Catalog facts against the real architectures: parameter counts and PEFT's LoRA counts.

Each family is built by transformers itself on PyTorch's meta device (no weights, no
downloads) from the catalog's config numbers, so a wrong number or a wrong layer layout
shows up as a count that differs from what transformers builds.
"""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    LlamaConfig,
    MistralConfig,
    MixtralConfig,
    Phi3Config,
    Qwen2Config,
    Qwen3Config,
)

from tunedeck.backend.spec import catalog

CONFIG_CLASSES = {
    "llama": LlamaConfig,
    "mistral": MistralConfig,
    "mixtral": MixtralConfig,
    "qwen2": Qwen2Config,
    "qwen3": Qwen3Config,
    "gemma2": Gemma2Config,
    "phi3": Phi3Config,
}

# Parameter counts the models' Hugging Face pages publish (safetensors metadata).
PUBLISHED_COUNTS = {
    "meta-llama/Llama-2-7b-hf": 6_738_415_616,
    "meta-llama/Llama-2-13b-hf": 13_015_864_320,
    "meta-llama/Llama-2-70b-hf": 68_976_648_192,
    "meta-llama/Meta-Llama-3-8B": 8_030_261_248,
    "meta-llama/Meta-Llama-3-70B": 70_553_706_496,
    "meta-llama/Llama-3.2-1B": 1_235_814_400,
    "meta-llama/Llama-3.2-3B": 3_212_749_824,
    "mistralai/Mistral-7B-v0.1": 7_241_732_096,
    "mistralai/Mixtral-8x7B-v0.1": 46_702_792_704,
    "Qwen/Qwen2.5-0.5B": 494_032_768,
    "Qwen/Qwen2.5-1.5B": 1_543_714_304,
    "Qwen/Qwen2.5-3B": 3_085_938_688,
    "Qwen/Qwen2.5-7B": 7_615_616_512,
    "Qwen/Qwen2.5-14B": 14_770_033_664,
    "Qwen/Qwen2.5-32B": 32_763_876_352,
    "Qwen/Qwen2.5-72B": 72_706_203_648,
    "Qwen/Qwen3-4B": 4_022_468_096,
    "Qwen/Qwen3-8B": 8_190_735_360,
    "Qwen/Qwen3-14B": 14_768_307_200,
    "Qwen/Qwen3-32B": 32_762_123_264,
    "google/gemma-2-2b": 2_614_341_888,
    "google/gemma-2-9b": 9_241_705_984,
    "google/gemma-2-27b": 27_227_128_320,
    "microsoft/Phi-3-mini-4k-instruct": 3_821_079_552,
    "microsoft/Phi-3-medium-4k-instruct": 13_960_238_080,
}

# One checkpoint per family (two for Llama: untied and tied embeddings), built on meta.
ON_META = [
    "meta-llama/Llama-2-7b-hf",
    "meta-llama/Llama-3.2-1B",
    "mistralai/Mistral-7B-v0.1",
    "mistralai/Mixtral-8x7B-v0.1",
    "Qwen/Qwen2.5-0.5B",
    "Qwen/Qwen3-0.6B",
    "google/gemma-2-2b",
    "microsoft/Phi-3-mini-4k-instruct",
]


def meta_model(arch: catalog.ModelArch):
    kwargs = dict(
        num_hidden_layers=arch.num_hidden_layers,
        hidden_size=arch.hidden_size,
        num_attention_heads=arch.num_attention_heads,
        num_key_value_heads=arch.num_key_value_heads,
        intermediate_size=arch.intermediate_size,
        vocab_size=arch.vocab_size,
        tie_word_embeddings=arch.tie_word_embeddings,
    )
    if arch.head_dim:
        kwargs["head_dim"] = arch.head_dim
    if arch.num_local_experts:
        kwargs.update(num_local_experts=arch.num_local_experts, num_experts_per_tok=arch.num_experts_per_tok)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(CONFIG_CLASSES[arch.model_type](**kwargs))


def trainable(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_the_issue_example_llama2_7b():
    assert catalog.lookup("meta-llama/Llama-2-7b-hf").num_parameters == 6_738_415_616


@pytest.mark.parametrize("name", sorted(PUBLISHED_COUNTS))
def test_parameter_count_matches_the_published_count(name):
    assert catalog.lookup(name).num_parameters == PUBLISHED_COUNTS[name]


def test_every_catalog_entry_cites_its_config_and_counts_positive():
    for name, arch in catalog.KNOWN.items():
        assert arch.source.startswith("https://huggingface.co/") and arch.source.endswith("/config.json"), name
        assert arch.num_parameters > arch.embedding_params > 0
        assert arch.decoder_layer_cls.endswith("DecoderLayer")


@pytest.mark.parametrize("name", ON_META)
def test_meta_device_model_has_the_catalog_counts(name):
    arch = catalog.lookup(name)
    model = meta_model(arch)
    assert sum(p.numel() for p in model.parameters()) == arch.num_parameters
    assert type(model.model.layers[0]).__name__ == arch.decoder_layer_cls
    # The largest module, as DeepSpeed's model_to_params finds it (ZeRO-3's live-parameter term).
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    assert largest == arch.largest_layer_params
    # What bitsandbytes would quantize: the nn.Linear weights of the decoder layers.
    linear = sum(
        m.weight.numel() for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in n
    )
    assert linear == arch.linear_params


@pytest.mark.parametrize("name", ON_META)
@pytest.mark.parametrize("r,targets", [(16, "all-linear"), (8, ["q_proj", "v_proj"])])
def test_lora_trainable_count_matches_peft_on_meta(name, r, targets):
    arch = catalog.lookup(name)
    if arch.model_type == "phi3" and targets != "all-linear":
        targets = ["qkv_proj", "o_proj"]  # Phi-3 fuses q, k and v
    peft_model = get_peft_model(
        meta_model(arch), LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets), low_cpu_mem_usage=True
    )
    assert trainable(peft_model) == arch.lora_trainable(r, targets)


def test_local_folder_is_read_from_its_config_json(demo_home):
    from transformers import AutoModelForCausalLM as Auto

    folder = str(demo_home / "model")
    arch = catalog.lookup(folder)
    assert arch is not None and arch.decoder_layer_cls == "LlamaDecoderLayer"
    model = Auto.from_pretrained(folder)
    assert sum(p.numel() for p in model.parameters()) == arch.num_parameters
    for r, targets in ((16, "all-linear"), (4, ["q_proj", "v_proj"])):
        model = Auto.from_pretrained(folder)
        peft_model = get_peft_model(model, LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets))
        assert trainable(peft_model) == arch.lora_trainable(r, targets)


def test_unknown_models_and_broken_folders_are_none(tmp_path):
    assert catalog.lookup("nobody/unknown-model") is None
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')  # incomplete
    assert catalog.lookup(str(tmp_path)) is None
    (tmp_path / "config.json").write_text('{"model_type": "bert", "hidden_size": 8}')
    assert catalog.lookup(str(tmp_path)) is None


@pytest.mark.parametrize(
    "name, targets",
    [
        ("microsoft/Phi-3-mini-4k-instruct", ["q_proj", "v_proj"]),  # fused qkv_proj: PEFT refuses
        ("microsoft/Phi-3-mini-4k-instruct", ["qkv_proj"]),
        ("mistralai/Mixtral-8x7B-v0.1", ["w1", "w2", "w3"]),  # transformers 4 expert names: PEFT maps them
        ("mistralai/Mixtral-8x7B-v0.1", ["w9"]),
        ("meta-llama/Llama-3.2-1B", ["query_key_value"]),
        ("meta-llama/Llama-3.2-1B", ["lm_head", "nonexistent"]),
    ],
)
def test_target_modules_rule_agrees_with_peft(name, targets):
    """validate's lora.target_modules error fires exactly when PEFT refuses the targets."""
    from peft.tuners.tuners_utils import NoMatchingPeftModuleError

    from tunedeck.backend.spec import resolve_spec
    from tunedeck.backend.validate import validate

    spec = resolve_spec("7b-lora-ddp", [f"model.name_or_path={name}", f"lora.target_modules={','.join(targets)}"])
    refused_by_validate = any(p.field == "lora.target_modules" and p.level == "error" for p in validate(spec))
    try:
        get_peft_model(
            meta_model(catalog.lookup(name)), LoraConfig(r=8, target_modules=targets), low_cpu_mem_usage=True
        )
        refused_by_peft = False
    except NoMatchingPeftModuleError:
        refused_by_peft = True
    assert refused_by_validate == refused_by_peft
