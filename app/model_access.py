"""The note under the form on where the model comes from: a local folder needs no login; a hub id
may be gated, and then needs a token on the machine that trains.

Whether a token is set is read the way huggingface_hub reads it (HF_TOKEN, then the token
file `hf auth login` writes), without importing it: the panel stays light. The note follows
the model box (a derived view of the job, app/job_events.py): redrawn only when the kind of
source changes.
"""

from __future__ import annotations

import os
from pathlib import Path

import gradio as gr

from tunedeck.app.job_events import DerivedView
from tunedeck.app.job_outputs import JobResult
from tunedeck.app.registry import Got, Registry, Updates

LOCAL, HUB = "local", "hub"


def token_source() -> str | None:
    """Where the hub token comes from (a description, never the token), or None when there is none."""
    if os.environ.get("HF_TOKEN", "").strip():
        return "HF_TOKEN is set"
    home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    path = Path(os.environ.get("HF_TOKEN_PATH") or home / "token")
    try:
        if path.is_file() and path.read_text(encoding="utf-8").strip():
            return f"a token saved by `hf auth login` ({path})"
    except OSError:
        return None
    return None


def model_source(name_or_path: str | None) -> str:
    """LOCAL for a folder on this machine (what from_pretrained loads without the hub), else HUB."""
    name = (name_or_path or "").strip()
    return LOCAL if name and Path(name).is_dir() else HUB


def access_markdown(source: str = HUB) -> str:
    if source == LOCAL:
        return (
            "**Model from a local folder:** loaded from disk, no hub login needed. Every machine that trains "
            "needs the same folder at this path (a shared filesystem on a cluster)."
        )
    token = token_source()
    state = f"Logged in here: {token}." if token else "Not logged in here (no HF_TOKEN, no saved token)."
    return (
        "**Gated models** (Llama, Gemma, some Mistral) download only after you accept their license on the model's "
        "hub page and log in on the machine that trains: `hf auth login` (saves a token), or "
        "`export HF_TOKEN=hf_...` before `tunedeck ui` / `bash launch.sh`. Qwen models are open. "
        f"{state} The memory estimate needs only the model's `config.json`: a model in the catalog, a local "
        "folder, or one in the Hugging Face cache (`hf download ORG/NAME config.json`)."
    )


class ModelAccessNote(DerivedView):
    """The note, redrawn by each job event whose model box changes the kind of source."""

    def __init__(self, ui: Registry, model: str):
        source = model_source(model)
        self.note = ui.add("job.model_access", gr.Markdown(access_markdown(source), elem_id="model-access"))
        self.shown = ui.add("job.model_source", gr.State(source))  # which note the browser shows
        self.inputs = []

    @property
    def outputs(self) -> list:
        return [self.note, self.shown]

    def context(self, got: Got) -> dict:
        return {}

    def update(self, result: JobResult, got: Got) -> Updates:
        source = model_source(result.values.get("model.name_or_path"))
        return {} if source == got[self.shown] else {self.note: access_markdown(source), self.shown: source}
