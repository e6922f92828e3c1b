"""Push a merged model folder to the Hugging Face Hub with huggingface_hub's own upload (no torch)."""

from __future__ import annotations

from pathlib import Path

from tunedeck.backend.runs.checkpoints import AfterError


def push_folder(folder: Path, repo_id: str, token: str | None, private: bool = True) -> str:
    """Create the model repo if needed and upload the folder; returns the repo's URL. AfterError says what failed."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError, OfflineModeIsEnabled
    from huggingface_hub.utils import validate_repo_id

    folder = Path(folder).expanduser().resolve()
    if not (folder / "config.json").is_file():
        raise AfterError(f"DIR: {folder} holds no model (no config.json): push the folder `tunedeck merge` wrote")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise AfterError(f"--repo-id: {exc}; give it as user/name or org/name") from None
    if "/" not in repo_id:
        raise AfterError(f"--repo-id: {repo_id!r} has no owner; give it as user/name or org/name")
    api = HfApi(token=token or None)
    try:
        api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        commit = api.upload_folder(
            folder_path=str(folder),
            repo_id=repo_id,
            repo_type="model",
            commit_message="Upload model merged by tunedeck",
        )
    except OfflineModeIsEnabled:
        raise AfterError("push: HF_HUB_OFFLINE is set, so huggingface_hub will not connect; unset it to push") from None
    except HfHubHTTPError as exc:
        status = getattr(exc.response, "status_code", None)
        if status in (401, 403):
            raise AfterError(
                f"push: the Hub refused the token ({status}): give a token with write access (HF_TOKEN or --token-file)"
            ) from None
        raise AfterError(f"push: the Hub answered {status}: {exc}") from None
    except (OSError, ValueError, *_transport_errors()) as exc:
        raise AfterError(
            f"push: cannot reach the Hugging Face Hub ({type(exc).__name__}: {exc}); check this machine's network "
            f"or copy {folder} to a machine that has one"
        ) from None
    return str(getattr(commit, "repo_url", "") or f"https://huggingface.co/{repo_id}")


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP client's "could not connect" errors: huggingface_hub 1.x+ uses httpx (here as httpx2), older ones requests."""
    found = []
    for module, name in (("httpx2", "TransportError"), ("httpx", "TransportError"), ("requests", "ConnectionError")):
        try:
            found.append(getattr(__import__(module), name))
        except (ImportError, AttributeError):
            continue
    return tuple(found)
