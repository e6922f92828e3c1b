"""The note beside the form on gated models and logging in to the Hugging Face hub.

Whether a token is set is read the way huggingface_hub reads it (HF_TOKEN, then the token
file `hf auth login` writes), without importing it: the panel stays light.
"""

from __future__ import annotations

import os
from pathlib import Path


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


def access_markdown() -> str:
    source = token_source()
    state = f"✓ Logged in here: {source}." if source else "✗ Not logged in here: no HF_TOKEN and no saved token."
    return (
        "**Gated models** (Llama, Gemma, some Mistral) download only after you accept their license on the model's "
        "hub page and log in on the machine that trains: `hf auth login` (saves a token), or "
        "`export HF_TOKEN=hf_...` before `tunedeck ui` / `bash launch.sh`. Qwen models are open. "
        f"{state} The memory estimate needs only the model's `config.json`: a model in the catalog, a local "
        "folder, or one in the Hugging Face cache (`hf download ORG/NAME config.json`)."
    )
