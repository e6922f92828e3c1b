"""More GPUs per sequence (DeepSpeed Ulysses, strategy.sequence_parallel): the advisor's way out for rows too long.

When no option that trains as the job does fits without offloading (long rows: their activations, which
every strategy keeps whole on each GPU, are what overflows), the advisor also weighs the DeepSpeed
options with N GPUs per sequence, each GPU holding 1/N of every row's activations, for the smallest N
that makes one fit. N comes from what Ulysses and the launch accept (backend/validate/sequence.py):
a divisor of the processes per machine (the all-to-alls of every layer stay inside it), with the
model's attention heads, and its key/value heads or N a multiple of them, split evenly. SFT only: TRL's
other trainers do not split sequences.
"""

from __future__ import annotations

from tunedeck.backend.estimate.advisor_options import candidates, sequence_parallel
from tunedeck.backend.estimate.memory_job import variant
from tunedeck.backend.recipe.vocabulary import STRATEGIES
from tunedeck.backend.spec import catalog


def sequence_sizes(v: dict) -> list[int]:
    """GPUs per sequence above the job's own that this job could use, smallest first (none for other objectives)."""
    arch = catalog.lookup(v["model.name_or_path"])
    if v["objective"] != "sft" or arch is None:
        return []
    processes = v["launch.num_processes"]
    per_machine = max(1, processes // v["launch.num_machines"])
    heads, kv = arch.num_attention_heads, arch.num_key_value_heads
    return [
        n
        for n in range(max(2, sequence_parallel(v) + 1), per_machine + 1)
        if per_machine % n == 0 and processes % n == 0 and heads % n == 0 and (kv % n == 0 or n % kv == 0)
    ]


def sequence_candidates(v: dict, n: int) -> list[tuple[str, dict]]:
    """(label, changes) of the DeepSpeed options that keep what the job trains, with n GPUs per sequence.

    Each also sets what Ulysses needs of the job (validate_sequence.py's fixes): no eager attention (accelerate
    refuses it), and no packing under SDPA (Ulysses drops the mask that keeps packed rows apart).
    """
    at_n = variant(v, {"strategy.sequence_parallel": n})
    needs: dict = {}
    if v["model.attn_implementation"] == "eager":
        needs["model.attn_implementation"] = "sdpa"
    if v.get("dataset.packing") and needs.get("model.attn_implementation", v["model.attn_implementation"]) == "sdpa":
        needs["dataset.packing"] = False
    return [
        (label, {**changes, **needs})
        for label, changes in candidates(at_n)
        if STRATEGIES[changes["strategy.kind"]].is_deepspeed and "method" not in changes
    ]


def sequence_reason(v: dict, n: int) -> str:
    """Why an option with n GPUs per sequence is the one: the rows' length, and what it costs."""
    return (
        f"rows of {v['dataset.max_seq_length']:,} tokens: their activations need {n} GPUs per sequence (DeepSpeed "
        f"Ulysses gives each GPU 1/{n} of every row and exchanges attention heads all-to-all in each layer); "
        f"the global batch is {n}x smaller, so raise training.gradient_accumulation_steps to keep it"
    )
