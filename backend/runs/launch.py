"""How a local run is launched: the accelerate command, its arguments and the environment of its ranks."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from tunedeck.backend.spec.env import environment


def inherited_env() -> dict[str, str]:
    """This process's environment minus the panel's own Gradio folders (removed when the panel exits)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("GRADIO_")}


def accelerate_command() -> str | None:
    """The accelerate console script of this Python's environment, or None when it is not installed."""
    # The console script of the same environment as this Python, not whatever PATH finds first.
    candidate = Path(sys.executable).parent / "accelerate"
    if candidate.is_file():
        return str(candidate)
    return None


def launch_args(spec) -> list[str]:
    from tunedeck.backend.render.launch import launch_argv

    args = launch_argv(spec)
    if spec.launch.num_machines == 1:
        # On one machine the rendezvous port is private: let accelerate pick a free one, so
        # two runs (or a run and someone's notebook) never collide on 29500.
        args[1:1] = ["--main_process_port", "0"]
    return args


def rank_env(spec, gpus: list[int] | None) -> dict[str, str]:
    per_machine = spec.launch.processes_per_machine
    env = {"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    if spec.strategy.is_deepspeed and not os.environ.get("TORCH_EXTENSIONS_DIR"):
        # DeepSpeed compiles an op against this environment's torch on first use (~1 min); keyed by
        # environment, two virtualenvs on one machine do not keep rebuilding each other's copy.
        key = hashlib.sha1(sys.prefix.encode()).hexdigest()[:10]
        env["TORCH_EXTENSIONS_DIR"] = str(Path.home() / ".cache" / "torch_extensions" / f"tunedeck-{key}")
    if gpus is None:
        # Measured: several threads per process on a small machine make training ~6x slower.
        env["OMP_NUM_THREADS"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU run stays on the CPU even on a GPU machine
    else:
        env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // per_machine))
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
    return env | environment(spec.launch.env)  # the job's own (launch.env) last: they are what it asked for
