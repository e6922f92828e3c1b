"""launch.env: environment variables set for every rank (NCCL's network, the CUDA allocator, caches ...).

Entries are NAME=VALUE. The names the launchers set themselves (ranks, rendezvous, the GPUs, accelerate's
own) are refused: a value here would fight them. So are names that look like secrets: job.yaml is copied
into every run folder and bundle, where a token would be readable by anyone who can read those; a token
belongs in the environment of the shell that starts the panel or the job, which every rank inherits.
"""

from __future__ import annotations

import re
from typing import Any

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A new entry starts at ", NAME=": the form's one-line box joins the entries with ", ", and a value may hold
# commas itself (NCCL_IB_HCA=mlx5_0,mlx5_1).
_ENTRY_START = re.compile(r",\s*(?=[A-Za-z_][A-Za-z0-9_]*=)")
# Set by torchrun / accelerate launch / the run manager for each rank (launch.gpu_ids picks the GPUs).
LAUNCHER_NAMES = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "NODE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "CUDA_VISIBLE_DEVICES",
        "MACHINE_RANK",
        "MAIN_PROCESS_IP",
    }
)
LAUNCHER_PREFIXES = ("ACCELERATE_", "TORCHELASTIC_", "PARALLELISM_CONFIG_", "FSDP_")
SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "API_KEY", "ACCESS_KEY", "CREDENTIAL")


def entries_from_text(value: Any) -> Any:
    """The form's box (entries joined by ", ") as a list; a list or anything else goes on as it is."""
    if isinstance(value, str):
        return [part.strip() for part in _ENTRY_START.split(value) if part.strip()]
    return value


def entry_problem(entry: str) -> str | None:
    """Why one NAME=VALUE entry cannot be set for the ranks, or None."""
    name, equals, _ = entry.partition("=")
    name = name.strip()
    if not equals or not ENV_NAME.fullmatch(name):
        return f"{entry[:40]!r} is not NAME=VALUE (a name of letters, digits and _, not starting with a digit)"
    if name in LAUNCHER_NAMES or name.startswith(LAUNCHER_PREFIXES):
        return f"{name} is set by the launcher for each rank" + (
            ": choose the GPUs with launch.gpu_ids" if name == "CUDA_VISIBLE_DEVICES" else ""
        )
    if any(word in name.upper() for word in SECRET_WORDS):
        return (
            f"{name} looks like a secret, and job.yaml is copied into every run folder and bundle: export it in "
            "the shell that starts tunedeck or launch.sh instead (every rank inherits it)"
        )
    return None


def entry_name(entry: str) -> str:
    """The entry's NAME, or ValueError saying why it cannot be set for the ranks."""
    problem = entry_problem(entry)
    if problem:
        raise ValueError(problem)
    return entry.partition("=")[0].strip()


def environment(entries: list[str]) -> dict[str, str]:
    """{NAME: VALUE} of valid entries (the spec has checked them)."""
    pairs = (entry.partition("=") for entry in entries)
    return {name.strip(): value for name, _, value in pairs}
