"""`tunedeck export-gguf`: the demo runs as GGUF files that llama.cpp's own binding loads and runs, with the run's chat
template and stop tokens in their metadata, and a Modelfile whose TEMPLATE Go's text/template (Ollama's engine)
renders into the very prompt the run trained on.

Everything is real: llama.cpp's converter (from llama-cpp-python's sources on PyPI, fetched by dev.sh), its
quantizer and loader (llama-cpp-python), and Go's text/template (Debian's golang-go, installed by dev.sh).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from .helpers import CHAT_SYSTEM, eval_prompts, tunedeck
from .ollama_standin import OllamaStandIn

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
GO_RENDERER = Path(__file__).parent / "ollama_template" / "main.go"


def export(runs_dir, run_id, *quants) -> tuple[Path, subprocess.CompletedProcess]:
    result = tunedeck("export-gguf", run_id, "--runs-dir", runs_dir, *(a for q in quants for a in ("--quant", q)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    return Path(runs_dir) / run_id / "gguf" / "final", result


def go_render(template: str, values: dict, scratch: Path) -> str:
    """The TEMPLATE rendered by Go's text/template over Ollama's values."""
    go = shutil.which("go") or "/usr/lib/go/bin/go"
    (scratch / "TEMPLATE").write_text(template, encoding="utf-8")
    env = {**os.environ, "GOCACHE": str(scratch / "go-cache"), "GOPATH": str(scratch / "go")}
    done = subprocess.run(
        [go, "run", str(GO_RENDERER), str(scratch / "TEMPLATE")],
        input=json.dumps(values),
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def modelfile_template(folder: Path) -> str:
    found = re.search(r'^TEMPLATE """(.*?)"""$', (folder / "Modelfile").read_text(), re.S | re.M)
    assert found, (folder / "Modelfile").read_text()
    return found.group(1)


def adapter_answers(demo_home: Path, adapter: Path, prompts: list[str], max_new_tokens: int) -> list[str]:
    """Greedy answers of the base + adapter through PEFT and transformers: what the export must keep."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(adapter)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(demo_home / "model"), adapter).eval()
    answers = []
    with torch.no_grad():
        for prompt in prompts:
            ids = tokenizer(prompt, return_tensors="pt")
            out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
            answers.append(tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True))
    return answers


def test_demo_run_exports_to_f16_and_q4_k_m_that_llama_cpp_loads_and_runs(demo_run, demo_home, tmp_path):
    from llama_cpp import Llama
    from transformers import AutoTokenizer

    runs_dir, run_id = demo_run
    folder, result = export(runs_dir, run_id, "f16", "q4_k_m")
    made = json.loads((folder / "export.json").read_text())
    assert set(made["files"]) == {"f16", "q4_k_m"}
    tokenizer = AutoTokenizer.from_pretrained(runs_dir / run_id / "output")
    prompts = eval_prompts(demo_home)[:8]  # held-out questions: "Q: ...\nA:"
    want = adapter_answers(demo_home, runs_dir / run_id / "output", prompts, max_new_tokens=8)
    for quant, entry in made["files"].items():
        path = folder / entry["file"]
        assert entry["bytes"] == path.stat().st_size and f"{entry['file']}  " in result.stdout
        meta = entry["metadata"]
        assert meta["chat_template"] == tokenizer.chat_template  # the run's template travelled
        assert (meta["bos_token"]["text"], meta["eos_token"]["text"]) == (tokenizer.bos_token, tokenizer.eos_token)
        model = Llama(model_path=str(path), n_ctx=128, verbose=False, seed=0)
        try:
            for prompt in prompts:  # llama.cpp reads a prompt as the run's tokenizer does
                assert model.tokenize(prompt.encode(), add_bos=True, special=True) == tokenizer(prompt)["input_ids"]
            got = []
            for prompt in prompts:
                out = model.create_completion(prompt, max_tokens=8, temperature=0.0)["choices"][0]
                got.append(out["text"])
                assert out["finish_reason"] == "stop"  # ended at the run's EOS, not cut at max_tokens
        finally:
            model.close()
        same = sum(a.strip() == b.strip() for a, b in zip(got, want))
        print(f"{quant}: {same}/{len(prompts)} answers as the adapter's; {got} vs {want}")
        assert all(answer.strip() for answer in got)
        if quant == "f16":  # half precision of a float32 model: the greedy answers stay the adapter's
            assert same == len(prompts), (got, want)
    # The export check says the same of the f16 file: llama.cpp with the GGUF's own template and EOS.
    checked = tunedeck(
        "check-export",
        run_id,
        folder / made["files"]["f16"]["file"],
        "--prompts",
        "8",
        "--runs-dir",
        runs_dir,
        "--json",
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert json.loads(checked.stdout)["summary"] == "8/8 answers identical after export"
    assert (folder / "Modelfile").read_text().splitlines()[0] == f"FROM ./{made['files']['q4_k_m']['file']}"
    assert 'PARAMETER stop "</s>"' in (folder / "Modelfile").read_text()
    # The run trained on prompt-completion rows: Ollama's prompt reaches the model as the row's prompt did.
    row = json.loads((demo_home / "data" / "train.jsonl").open().readline())
    assert go_render(modelfile_template(folder), {"prompt": row["prompt"]}, tmp_path) == row["prompt"]


def test_chat_run_modelfile_renders_a_conversation_as_its_chat_template_does(chat_run, tmp_path):
    from llama_cpp import Llama
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter
    from transformers import AutoTokenizer

    runs_dir, run_id = chat_run
    folder, result = export(runs_dir, run_id, "q8_0")
    assert "chat prompt format" in result.stdout
    tokenizer = AutoTokenizer.from_pretrained(runs_dir / run_id / "output")
    conversation = [
        {"role": "system", "content": CHAT_SYSTEM},
        {"role": "user", "content": "Add the numbers. 2 + 3"},
        {"role": "assistant", "content": "5"},
        {"role": "user", "content": "Reverse the letters. a b"},
    ]
    want = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    got = go_render(modelfile_template(folder), {"messages": conversation}, tmp_path)
    assert got == want.removeprefix(tokenizer.bos_token)  # llama.cpp puts the BOS itself
    # Every training conversation opens with the same system message: Ollama sends it when a user gives none.
    assert f'SYSTEM """{CHAT_SYSTEM}"""' in (folder / "Modelfile").read_text()
    # llama.cpp's binding builds its chat prompt from the template in the GGUF's metadata: the same text again.
    model = Llama(model_path=str(next(folder.glob("*-q8_0.gguf"))), n_ctx=128, verbose=False)
    try:
        meta = model.metadata
        formatter = Jinja2ChatFormatter(
            meta["tokenizer.chat_template"],
            eos_token=model.detokenize([model.token_eos()], special=True).decode(),
            bos_token=model.detokenize([model.token_bos()], special=True).decode(),
        )
        assert formatter(messages=conversation).prompt == want
    finally:
        model.close()


def test_export_refuses_an_unknown_quant_and_a_taken_folder(demo_run, tmp_path):
    runs_dir, run_id = demo_run
    result = tunedeck("export-gguf", run_id, "--runs-dir", runs_dir, "--quant", "q3_xx")
    assert result.returncode == 2 and "--quant: q3_xx is not one of f16, bf16, q8_0, q4_k_m, q5_k_m" in result.stderr
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "a-file").write_text("mine")
    result = tunedeck("export-gguf", run_id, "--runs-dir", runs_dir, "-o", taken)
    assert result.returncode == 2 and "-o:" in result.stderr and "already exists" in result.stderr
    assert (taken / "a-file").read_text() == "mine" and "Traceback" not in result.stderr


def test_create_in_ollama_uploads_the_gguf_and_creates_the_model_as_its_modelfile_says(chat_run, tmp_path):
    """Create in Ollama through Ollama's own client, against a stand-in server that checks what Ollama checks."""
    from tunedeck.backend.after.ollama_create import create_model, server_models
    from tunedeck.backend.runs import AfterError

    runs_dir, run_id = chat_run
    folder = Path(runs_dir) / run_id / "gguf" / "final"
    if not folder.is_dir():  # the test above exported it; alone, this one exports
        export(runs_dir, run_id, "q8_0")
    made = json.loads((folder / "export.json").read_text())
    nothing = "http://127.0.0.1:9"  # nothing listens there
    assert server_models(nothing) is None
    with pytest.raises(AfterError, match="^Ollama server: nothing answers at http://127.0.0.1:9; start `ollama serve`"):
        create_model(folder, nothing)
    standin = OllamaStandIn(tmp_path / "blobs")
    try:
        assert server_models(standin.url) == []
        steps = []
        assert create_model(folder, standin.url, lambda *step: steps.append(step)) == {
            "model": made["ollama_name"],
            "host": standin.url,
        }
        assert steps[0][0].startswith(f"uploading {made['modelfile']['from']} (") and steps[-1] == ("created", 2, 2)
        assert ("Ollama: success", 1, 2) in steps  # the server's own progress lines
        gguf = folder / made["modelfile"]["from"]
        request = standin.models[made["ollama_name"]]["request"]
        digest = request["files"][gguf.name]
        assert standin.blob(digest).read_bytes() == gguf.read_bytes()  # the file itself, by its sha256
        modelfile = (folder / "Modelfile").read_text()
        assert request["template"] == modelfile_template(folder)
        assert request["parameters"] == {"stop": ["</s>"]} and 'PARAMETER stop "</s>"' in modelfile
        assert request["system"] == CHAT_SYSTEM
        assert server_models(standin.url) == [made["ollama_name"]]
    finally:
        standin.close()
