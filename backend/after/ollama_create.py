"""Create in Ollama: an exported GGUF with its Modelfile's template, stop tokens and system prompt, sent to an Ollama
server through Ollama's official client (the `ollama` package) as `ollama create -f Modelfile` sends them: the file as
a blob (POST /api/blobs/<sha256>), then the model (POST /api/create with files, template, parameters, system).

No torch: it runs in the panel's process. What it sends comes from the export's export.json (backend/after/
gguf_export.py), the same pieces its Modelfile was written from (backend/after/modelfile.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from tunedeck.backend.after.gguf_export import EXPORT_FILE
from tunedeck.backend.runs.checkpoints import AfterError

DEFAULT_HOST = "http://127.0.0.1:11434"  # where `ollama serve` listens unless OLLAMA_HOST says otherwise
PROBE_TIMEOUT_S = 3.0


def default_host() -> str:
    return os.environ.get("OLLAMA_HOST") or DEFAULT_HOST


def _client(host: str, timeout_s: float | None):
    try:
        import ollama  # pyright: ignore[reportMissingImports] - the export extra, installed beside the lint
    except ImportError:
        raise AfterError("Create in Ollama needs Ollama's client: pip install 'tunedeck[export]'") from None
    return ollama.Client(host=host.strip() or default_host(), timeout=timeout_s)


def server_models(host: str) -> list[str] | None:
    """The models an Ollama server at `host` holds, or None when none answers there (in PROBE_TIMEOUT_S)."""
    try:
        return [m.model or "" for m in _client(host, PROBE_TIMEOUT_S).list().models]
    except AfterError:
        raise
    except Exception:  # noqa: BLE001 - nothing listening, a proxy's error page, a timeout: no server to offer
        return None


def create_model(export_dir: Path, host: str, say: Callable[[str, int, int], None] | None = None) -> dict:
    """Upload the export's GGUF (its Modelfile's FROM) and create its model on the server: {"model", "host"}."""
    import ollama  # pyright: ignore[reportMissingImports] - the export extra, installed beside the lint

    say = say or (lambda *a: None)
    try:
        info = json.loads((export_dir / EXPORT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise AfterError(
            f"Create in Ollama: {export_dir} holds no readable {EXPORT_FILE}: export GGUF first ({exc})"
        ) from None
    spec = info["modelfile"]
    gguf = export_dir / spec["from"]
    client = _client(host, None)  # a large file takes as long as it takes
    try:
        say(f"uploading {gguf.name} ({gguf.stat().st_size / 2**20:.1f} MiB) to Ollama at {host}", 0, 2)
        digest = client.create_blob(gguf)
        say(f"creating {info['ollama_name']}", 1, 2)
        for progress in client.create(
            model=info["ollama_name"],
            files={gguf.name: digest},
            template=spec["template"],
            parameters={"stop": spec["stops"]} if spec["stops"] else None,
            system=spec["system"] or None,
            stream=True,
        ):
            say(f"Ollama: {progress.status}", 1, 2)
    except ConnectionError:
        raise AfterError(
            f"Ollama server: nothing answers at {host}; start `ollama serve` there, or name another"
        ) from None
    except ollama.ResponseError as exc:
        raise AfterError(f"Ollama refused the model ({exc.status_code}): {exc.error}") from None
    except Exception as exc:  # noqa: BLE001 - an address httpx cannot use, a link lost mid-upload: said, not raised
        raise AfterError(f"Ollama server at {host}: {type(exc).__name__}: {exc}") from None
    say("created", 2, 2)
    return {"model": info["ollama_name"], "host": host}
