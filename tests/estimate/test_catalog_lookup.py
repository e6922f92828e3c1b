"""Finding a model's architecture: hub ids as people type them, and the local Hugging Face cache."""

from __future__ import annotations

import json

import pytest

from tunedeck.backend.estimate.advisor import advise
from tunedeck.backend.spec import catalog, resolve_spec

QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 4096,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 12288,
    "vocab_size": 151936,
    "tie_word_embeddings": False,
    "attention_bias": False,
}


@pytest.mark.parametrize(
    "name",
    [
        "meta-llama/Meta-Llama-3.1-8B-Instruct",
        "Meta-Llama-3.1-8B-Instruct",  # without its organisation
        "meta-llama/llama-3.1-8b-instruct",  # hub ids are case-insensitive
        "meta-llama/Llama-3.1-8B-Instruct",
    ],
)
def test_llama_31_8b_instruct_gets_an_estimate_however_it_is_typed(name):
    assert catalog.lookup(name).num_parameters == 8_030_261_248
    spec = resolve_spec("7b-lora-ddp", [f"model.name_or_path={name}"])
    assert 16 < advise(spec, 80).current.per_gpu_gb < 40


def write_cached_model(hub: str, repo_id: str, config: dict, revision: str = "abc123") -> None:
    """The layout huggingface_hub writes: models--org--name/{refs/main, snapshots/<revision>/config.json}."""
    folder = f"{hub}/models--{repo_id.replace('/', '--')}"
    import os

    os.makedirs(f"{folder}/refs", exist_ok=True)
    os.makedirs(f"{folder}/snapshots/{revision}", exist_ok=True)
    with open(f"{folder}/refs/main", "w") as f:
        f.write(revision)
    with open(f"{folder}/snapshots/{revision}/config.json", "w") as f:
        json.dump(config, f)


def test_a_model_in_the_local_hugging_face_cache_is_read_from_its_config(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    name = "acme/qwen3-8b-finetuned"
    assert catalog.lookup(name) is None
    write_cached_model(str(tmp_path / "hub"), name, QWEN3_8B)
    arch = catalog.lookup(name)
    assert arch.decoder_layer_cls == "Qwen3DecoderLayer"
    assert arch.num_parameters == catalog.lookup("Qwen/Qwen3-8B").num_parameters
    assert arch.source.endswith("snapshots/abc123/config.json")
    spec = resolve_spec("7b-lora-ddp", [f"model.name_or_path={name}"])
    assert advise(spec, 80).current.per_gpu_gb > 16


def test_hf_hub_cache_wins_and_odd_ids_are_not_paths(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "unused"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    write_cached_model(str(tmp_path / "cache"), "acme/small", QWEN3_8B | {"num_hidden_layers": 2})
    assert catalog.lookup("acme/small").num_hidden_layers == 2
    assert catalog.cached_config("../etc") is None and catalog.cached_config("a/b/c") is None


def test_unknown_model_message_says_how_to_make_it_known():
    from tunedeck.backend.estimate.memory_job import EstimateError, input_values

    with pytest.raises(EstimateError, match="hf download ORG/NAME config.json"):
        input_values(resolve_spec("7b-lora-ddp", ["model.name_or_path=nobody/secret-model"]))
