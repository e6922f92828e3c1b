"""llama.cpp's own GGUF tools, as llama.cpp ships them: its converter (convert_hf_to_gguf.py), its quantizer and loader
(through llama-cpp-python, llama.cpp's Python binding). tunedeck writes no converter.

The converter is not in any wheel: llama.cpp ships it beside its sources, and llama-cpp-python's source archive on
PyPI holds the very llama.cpp its binding was built from. `converter()` takes convert_hf_to_gguf.py, its
`conversion` package and llama.cpp's own gguf-py (newer than the `gguf` release on PyPI) from that archive once,
for the version installed here (so the converter writes what this quantizer and loader read), into
$TUNEDECK_HOME/llama.cpp/<version>/, or uses a llama.cpp checkout named by $TUNEDECK_LLAMA_CPP. Imports no torch:
the converter runs in a subprocess of its own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from importlib import metadata
from pathlib import Path

from tunedeck.backend.runs.checkpoints import AfterError
from tunedeck.backend.spec import demo_home

CONVERTER = "convert_hf_to_gguf.py"
PACKAGE = "llama-cpp-python"
CHECKOUT_ENV = "TUNEDECK_LLAMA_CPP"
# What the converter needs of llama.cpp's tree: the script puts gguf-py/ on its path itself. (The `gguf` release on
# PyPI with gguf-py's version number lacks what this converter uses: "no attribute 'LazyChunkedTensor'".)
TAKEN = (CONVERTER, "conversion/", "gguf-py/", "LICENSE")
FETCH_TIMEOUT_S = 600


def binding_version() -> str:
    """The installed llama-cpp-python's version; AfterError saying how to install it when it is missing."""
    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        raise AfterError(
            f"GGUF export needs llama.cpp's Python binding: pip install '{PACKAGE}' (it compiles llama.cpp, a few "
            "minutes), or install tunedeck with its `export` extra"
        ) from None


def home() -> Path:
    """Where converters are kept: next to the demo ($TUNEDECK_HOME/llama.cpp), as smoke runs keep their models."""
    return demo_home().parent / "llama.cpp"


def converter(fetch: bool = True) -> Path:
    """The folder holding convert_hf_to_gguf.py and conversion/; fetched from PyPI the first time when `fetch`."""
    checkout = os.environ.get(CHECKOUT_ENV)
    if checkout:
        folder = Path(checkout).expanduser()
        if not (folder / CONVERTER).is_file():
            raise AfterError(f"{CHECKOUT_ENV}: {folder} holds no {CONVERTER}; point it at a llama.cpp checkout")
        return folder
    folder = home() / binding_version()
    if (folder / CONVERTER).is_file():
        return folder
    if not fetch:
        raise AfterError(f"llama.cpp's converter is not in {folder} yet: `tunedeck export-gguf --fetch-converter`")
    return fetch_converter(folder)


def fetch_converter(folder: Path) -> Path:
    """Download llama-cpp-python's source archive (the installed version) and keep llama.cpp's converter from it."""
    version = binding_version()
    with tempfile.TemporaryDirectory(prefix="tunedeck-llama-cpp-") as tmp:
        argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--dest", tmp]
        done = subprocess.run(
            [*argv, f"{PACKAGE}=={version}"],
            capture_output=True,
            text=True,
            timeout=FETCH_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
        archives = sorted(Path(tmp).glob("*.tar.gz"))
        if done.returncode != 0 or not archives:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise AfterError(
                f"llama.cpp's converter: downloading {PACKAGE}=={version}'s sources from PyPI failed ({last[:200]}); "
                f"on a machine without PyPI set {CHECKOUT_ENV} to a llama.cpp checkout"
            )
        staging = folder.parent / f".{folder.name}.partial-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        _extract(archives[0], staging)
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        staging.rename(folder)
    except OSError:  # another process took it first: theirs is the same
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def _extract(archive: Path, into: Path) -> None:
    """llama.cpp's converter files out of the archive (<name>/vendor/llama.cpp/...), and nothing else."""
    with tarfile.open(archive) as tar:
        members = []
        for member in tar.getmembers():
            parts = member.name.split("/", 3)
            if len(parts) == 4 and parts[1:3] == ["vendor", "llama.cpp"] and parts[3].startswith(TAKEN):
                member.name = parts[3]
                members.append(member)
        if not any(m.name == CONVERTER for m in members):
            raise AfterError(f"{archive.name} holds no vendor/llama.cpp/{CONVERTER}; set {CHECKOUT_ENV} instead")
        tar.extractall(into, members=members, filter="data")  # "data": no links out, no absolute paths


def convert(model_dir: Path, out_file: Path, outtype: str, on_line=None) -> None:
    """llama.cpp's converter: a Hugging Face model folder to one GGUF file of `outtype` (f16, bf16, q8_0, f32)."""
    folder = converter()
    argv = [sys.executable, str(folder / CONVERTER), str(model_dir), "--outfile", str(out_file), "--outtype", outtype]
    env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"}  # set, the script would skip its gguf-py
    env["HF_HUB_OFFLINE"] = "1"
    lines: list[str] = []
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, stdin=subprocess.DEVNULL
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip())
            if on_line:
                on_line(line.rstrip())
    if proc.returncode != 0 or not out_file.is_file():
        why = next((line for line in reversed(lines) if line.strip()), "no output")
        raise AfterError(f"llama.cpp's converter failed on {model_dir.name} ({why[:300]})")


QUANT_TYPES = {
    "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
    "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
    "q5_k_m": "LLAMA_FTYPE_MOSTLY_Q5_K_M",
}


def quantize(source: Path, out_file: Path, quant: str) -> None:
    """llama.cpp's quantizer (llama_model_quantize) from an f16 GGUF to `quant`."""
    import ctypes

    binding_version()
    import llama_cpp  # pyright: ignore[reportMissingImports] - dev.sh installs it beside the lint

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, QUANT_TYPES[quant])
    params.nthread = max(1, (os.cpu_count() or 1))
    rc = llama_cpp.llama_model_quantize(str(source).encode(), str(out_file).encode(), ctypes.pointer(params))
    if rc != 0 or not out_file.is_file():
        raise AfterError(f"llama.cpp's quantizer failed making {quant} from {source.name} (return code {rc})")


def metadata_of(path: Path) -> dict:
    """What a GGUF file says, as llama.cpp reads it: its type, chat template and BOS/EOS/EOT tokens (id and text)."""
    binding_version()
    from llama_cpp import Llama  # pyright: ignore[reportMissingImports] - as above

    model = Llama(model_path=str(path), vocab_only=True, verbose=False)
    try:
        fields = model.metadata
        found: dict[str, object] = {
            "file_type": fields.get("general.file_type"),
            "chat_template": fields.get("tokenizer.chat_template"),
        }
        for role in ("bos", "eos", "eot", "eom", "padding"):
            token_id = fields.get(f"tokenizer.ggml.{role}_token_id")
            if token_id is not None:
                text = model.detokenize([int(token_id)], special=True).decode("utf-8", "replace")
                found[f"{role}_token"] = {"id": int(token_id), "text": text}
        return found
    finally:
        model.close()
