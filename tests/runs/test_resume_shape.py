"""Resume on another number of processes, on real demo runs (issue 34, part 3; backend/runs/reshape.py,
backend/recipe/reshard.py, backend/recipe/restore.py), for each strategy whose checkpoint is laid out otherwise:
DDP (one whole optimizer state), ZeRO-2 and ZeRO-3 (one optimizer shard per process: resumed through DeepSpeed's
universal checkpoint) and FSDP2 (torch distributed checkpoint, which reshards as it loads).

Each is one chain of three runs in one output folder: a run on 2 processes fails after its checkpoint at step 8;
`tunedeck runs resume ID --num-processes 1` goes on from it and fails after its checkpoint at step 16; `--num-
processes 2` goes on from that and finishes. The global batch stays 4 (gradient accumulation 1 -> 2 -> 1); the
losses of the steps trained again after each resume are those the run had at those steps before (the gaps and the
noise of two identical runs are measured and printed); each resumed run's start record says what it restored
(optimizer step, learning-rate schedule position, data position) and the sanity gate passed it. A resume that moves
the data position (the same checkpoint on 1 process without re-solving the accumulation) is stopped by the gate.
The first run of each DeepSpeed chain also proves what the run got on ZeRO-2 and ZeRO-3 (engine, optimizer) and its
MFU against a stand-in peak (the GPU path of MFU on CPU; bench/gpu_check.sh checks the real one). The ZeRO-3 and
FSDP2 chains' last checkpoints (saved by 2 processes at the final step) are then consolidated from their shards and
merged by `tunedeck merge --checkpoint` (the merge tests at the end).

One failed DDP run serves the module twice (ddp_twin): the DDP chain's twin, to measure the noise of two identical
runs, and the checkpoint the gate test resumes by hand (a 2-process run of 12 steps: 20 s in CI beside the other lane).
The gate test resumes it into a runs folder of its own and leaves the twin's run folder as it was."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from safetensors.torch import load_file

from tunedeck.backend.runs.manager import RunManager
from tunedeck.backend.spec import flops, resolve_spec, set_paths
from tunedeck.tests.after.helpers import eval_prompts, max_difference, merged_logits, peft_logits

from .helpers import log_records, logs_tail, read_metrics, tunedeck

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

STEPS = {"training.max_steps": 24, "training.save_steps": 8, "launch.max_restarts": 0}  # the last save is the final
FIRST_FAIL, SECOND_FAIL = 12, 19  # each after a checkpoint (8, 16): the steps after it are trained again
STRATEGIES = {"ddp": "ddp", "zero2": "zero2", "zero3": "zero3", "fsdp2": "fsdp"}
STAND_IN_PEAK = "0.05"  # TFLOPS: MFU is defined on CPU too


def losses(run_dir) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir) if r["event"] == "log" and "loss" in r}


def start_record(run_dir) -> dict:
    return next(r for r in read_metrics(run_dir) if r["event"] == "start")


def failed_run(manager: RunManager, demo_spec, kind: str) -> str:
    os.environ["TUNEDECK_FAULT"] = f"rank=0,step={FIRST_FAIL}"  # its supervisor inherits it; later runs do not
    os.environ[flops.PEAK_ENV] = STAND_IN_PEAK
    try:
        run_id = manager.start(demo_spec({**STEPS, "strategy.kind": kind, "launch.num_processes": 2}))
    finally:
        del os.environ["TUNEDECK_FAULT"], os.environ[flops.PEAK_ENV]
    status = manager.wait(run_id, timeout=300)
    assert status.state == "failed" and (manager.run_dir(run_id) / "output" / "checkpoint-8").is_dir(), (
        f"{status}\n{logs_tail(manager.run_dir(run_id))}"
    )
    return run_id


@pytest.fixture(scope="module")
def ddp_twin(demo_home, tmp_path_factory) -> tuple[RunManager, str]:
    """(its manager, its id) of a DDP run on 2 processes that failed after its checkpoint at step 8, made once for
    the module in a runs folder of its own."""
    manager = RunManager(tmp_path_factory.mktemp("resume-shape-twin"))
    return manager, failed_run(manager, lambda overrides: set_paths(resolve_spec("demo"), overrides), "ddp")


def resumed(manager: RunManager, run_id: str, processes: int, fault: str | None) -> tuple[str, str]:
    """(the new run's id, what `tunedeck runs resume` said)."""
    if fault:
        os.environ["TUNEDECK_FAULT"] = fault
    try:
        result = tunedeck(
            "runs", "resume", run_id, "--num-processes", str(processes), "--runs-dir", manager.runs_dir, timeout=600
        )
    finally:
        os.environ.pop("TUNEDECK_FAULT", None)
    assert "continues run" in result.stdout, result.stdout + result.stderr
    return result.stdout.split()[1].rstrip(":"), result.stdout


def deepspeed_run_and_mfu(run_dir, stage: int) -> None:
    """A 2-rank LoRA run on ZeRO-`stage` got DeepSpeed's engine and ZeRO optimizer, and logged an MFU against the
    stand-in peak that its throughput and the model's FLOPs per token account for."""
    start = start_record(run_dir)
    assert start["world_size"] == 2
    assert start["distributed_type"] == "DEEPSPEED" and start["zero_stage"] == stage
    assert start["model_class"] == "DeepSpeedEngine"
    assert start["optimizer_class"] == ("DeepSpeedZeroOptimizer_Stage3" if stage == 3 else "DeepSpeedZeroOptimizer")
    assert start["peak_tflops"] == float(STAND_IN_PEAK) and start["peak_source"] == flops.PEAK_ENV
    inputs = start["flops_inputs"]
    assert inputs["trainable_params"] == start["trainable_params"] and not inputs["full"]
    model, _ = flops.flops_per_token(*[inputs[k] for k in ("matmul_params", "trainable_params", "layers")],
                                     inputs["attention_width"], 1, False, False)  # fmt: skip
    records = log_records(run_dir)
    assert [r["step"] for r in records] == list(range(1, FIRST_FAIL))
    for record in records:
        assert 0 < record["mfu"] <= record["hfu"] < 1
        assert record["mfu"] >= record["tokens_per_second"] / 2 * model / (float(STAND_IN_PEAK) * 1e12)  # + attention


def check_restored(run_dir, step: int, processes: int, resharded: bool) -> dict:
    start = start_record(run_dir)
    restored = start["restored"]
    assert start["world_size"] == processes and start["resumed_from_step"] == step, start
    assert start["gate"] == {"passed": True, "problems": []}, start["gate"]
    assert restored["optimizer_step"] == restored["lr_schedule_step"] == step, restored
    assert restored["data_rows"] == restored["saved"]["rows"] == step * 4, restored
    assert restored["learning_rate"] == pytest.approx(restored["saved"]["learning_rate"], rel=1e-6), restored
    assert restored["saved"]["data_parallel"] == 3 - processes, restored
    assert (restored["resharded_from"] == 3 - processes) if resharded else restored["resharded_from"] is None
    return restored


@dataclass
class Chain:
    """The three runs of a chain (2 -> 1 -> 2 processes, one output folder: the first's) and what each resume said."""

    manager: RunManager
    first: str
    second: str
    third: str
    said_second: str
    said_third: str


@pytest.fixture(scope="module")
def chains(demo_home, tmp_path_factory) -> Callable[[str], Chain]:
    """Factory: a strategy's chain, run once for the module (the resume test asserts it; the merge tests below
    consolidate its last checkpoint, saved by 2 processes at the final step)."""
    manager = RunManager(tmp_path_factory.mktemp("resume-shape"))
    built: dict[str, Chain] = {}

    def chain(strategy: str) -> Chain:
        if strategy not in built:
            demo_spec = lambda overrides: set_paths(resolve_spec("demo"), overrides)  # noqa: E731
            first = failed_run(manager, demo_spec, STRATEGIES[strategy])
            second, said_second = resumed(manager, first, 1, f"rank=0,step={SECOND_FAIL}")
            third, said_third = resumed(manager, second, 2, None)
            built[strategy] = Chain(manager, first, second, third, said_second, said_third)
        return built[strategy]

    return chain


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_run_goes_on_with_another_number_of_processes_and_the_same_global_batch(chains, strategy, request):
    chain = chains(strategy)
    manager, first, second, third = chain.manager, chain.first, chain.second, chain.third
    noise = None
    if strategy == "ddp":  # the same job again: how much two identical runs differ
        twin_manager, twin = request.getfixturevalue("ddp_twin")
        one, two = losses(manager.run_dir(first)), losses(twin_manager.run_dir(twin))
        noise = max(abs(one[s] - two[s]) for s in one)
    assert (
        f"continues run {first} from its checkpoint at step 8, on 1 process (1 machine) instead of 2, gradient "
        "accumulation 1 → 2: the global batch stays 4"
    ) in chain.said_second, chain.said_second
    assert manager.status(second).state == "failed", logs_tail(manager.run_dir(second))
    assert (
        "from its checkpoint at step 16, on 2 processes (1 machine) instead of 1, gradient accumulation 2 → 1"
        in chain.said_third
    )
    assert manager.status(third).state == "finished", logs_tail(manager.run_dir(third))
    assert (manager.run_dir(first) / "output" / "adapter_model.safetensors").is_file()  # the chain's one output folder

    sharded = strategy.startswith("zero")
    if sharded:
        deepspeed_run_and_mfu(manager.run_dir(first), int(strategy[-1]))
    check_restored(manager.run_dir(second), 8, 1, sharded)
    check_restored(manager.run_dir(third), 16, 2, sharded)
    start = start_record(manager.run_dir(third))
    assert (start["zero_stage"], start["fsdp_version"]) == {
        "ddp": (None, None),
        "zero2": (2, None),
        "zero3": (3, None),
        "fsdp2": (None, 2),
    }[strategy]
    gaps = []
    for before, after, steps in ((first, second, range(9, FIRST_FAIL)), (second, third, range(17, SECOND_FAIL))):
        old, new = losses(manager.run_dir(before)), losses(manager.run_dir(after))
        assert all(s in old and s in new for s in steps), (sorted(old), sorted(new))
        gaps += [abs(new[s] - old[s]) for s in steps]
        worst = max(abs(new[s] - old[s]) / old[s] for s in steps)
        assert worst <= 0.01, f"{strategy}: after the resume the loss moved by {worst:.2%} of itself"
    assert max(losses(manager.run_dir(third))) == STEPS["training.max_steps"]
    noise_said = f", noise of two identical runs {noise:.5f}" if noise is not None else ""
    print(f"{strategy} 2 -> 1 -> 2 processes: loss gaps after the resumes {[f'{g:.5f}' for g in gaps]}{noise_said}")


def test_a_resume_that_moves_the_data_position_is_stopped_by_the_gate(runs_dir, ddp_twin):
    """The same checkpoint resumed by hand on 1 process with the accumulation left at 1: each step would take 2 rows
    instead of 4, so step 8 would sit at row 16 where the checkpoint had seen 32; the gate says so before a step."""
    manager, first = ddp_twin
    output = manager.run_dir(first) / "output"
    job = manager.run_dir(first) / "job.yaml"
    result = tunedeck(
        "train",
        job,
        "--set",
        "training.resume_from_checkpoint=true",
        "--set",
        f"output_dir={output}",
        "--set",
        "launch.num_processes=1",
        "--runs-dir",
        runs_dir,
        timeout=600,
    )
    assert result.returncode != 0, result.stdout
    run_dir = max(runs_dir.iterdir(), key=lambda p: p.stat().st_mtime)  # the twin's run is in another runs folder
    start = start_record(run_dir)
    assert not start["gate"]["passed"], start
    problem = " ".join(start["gate"]["problems"])
    assert (
        "resumed from checkpoint-8 (step 8), but its data position is row 16 where the checkpoint had seen 32: the "
        "global batch changed (4 rows a step then)"
    ) in problem, problem
    assert "step" not in json.dumps([r for r in read_metrics(run_dir) if r["event"] == "log"]), "it trained a step"


# ---------------------------------------------------------------- merging a sharded checkpoint

MERGE_TOLERANCE = 1e-4


def merge(runs_dir, run_id, out, checkpoint: int) -> None:
    result = tunedeck(
        "merge", run_id, "-o", out, "--dtype", "float32", "--checkpoint", str(checkpoint), "--runs-dir", runs_dir
    )
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stdout + result.stderr


def test_a_zero3_checkpoint_is_consolidated_from_its_shards_and_merged(chains, demo_home, tmp_path):
    """`tunedeck merge --checkpoint` of a ZeRO-3 checkpoint: the adapter is rebuilt from the ranks' parameter shards."""
    chain = chains("zero3")
    last = STEPS["training.max_steps"]
    runs_dir = tmp_path / "runs"  # a copy of the chain's first run (its output folder), changed below
    shutil.copytree(chain.manager.run_dir(chain.first), runs_dir / chain.first)
    checkpoint = runs_dir / chain.first / "output" / f"checkpoint-{last}"
    shards = sorted((checkpoint / f"global_step{last}").glob("zero_pp_rank_*_mp_rank_00_model_states.pt"))
    assert len(shards) == 2  # one per rank: a checkpoint no single process wrote whole
    # The adapter the trainer gathered at save time is the reference; take it out of the checkpoint so the
    # merge can only get the weights from the ZeRO shards.
    reference_dir = tmp_path / "gathered"
    reference_dir.mkdir()
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        shutil.copy(checkpoint / name, reference_dir / name)
    (checkpoint / "adapter_model.safetensors").unlink()

    out = tmp_path / "merged"
    merge(runs_dir, chain.first, out, last)
    consolidated = load_file(
        runs_dir / chain.first / "consolidated" / f"checkpoint-{last}" / "adapter_model.safetensors"
    )
    gathered = load_file(reference_dir / "adapter_model.safetensors")
    assert consolidated.keys() == gathered.keys()
    assert all(bool((consolidated[k] == gathered[k]).all()) for k in gathered)

    prompts = eval_prompts(demo_home)
    merged, _ = merged_logits(out, prompts, tmp_path)
    assert max_difference(peft_logits(demo_home / "model", reference_dir, prompts), merged) < MERGE_TOLERANCE
    assert json.loads((out / "tunedeck_merge.json").read_text())["weights"] == f"checkpoint-{last}"


def test_an_fsdp_sharded_checkpoint_is_consolidated_and_merged(chains, demo_home, tmp_path):
    """`tunedeck merge --checkpoint` of an FSDP2 checkpoint (SHARDED_STATE_DICT: torch.distributed.checkpoint)."""
    chain = chains("fsdp2")
    last = STEPS["training.max_steps"]
    run_dir = chain.manager.run_dir(chain.first)
    checkpoint = run_dir / "output" / f"checkpoint-{last}"
    assert (checkpoint / "pytorch_model_fsdp_0" / ".metadata").is_file()
    assert not list(checkpoint.glob("adapter_model.*"))  # FSDP's sharded checkpoint holds no adapter file
    out = tmp_path / "merged"
    merge(chain.manager.runs_dir, chain.first, out, last)
    # The last checkpoint's step is also the final save, which FSDP gathered into a plain adapter (FULL_STATE_DICT).
    prompts = eval_prompts(demo_home)
    merged, _ = merged_logits(out, prompts, tmp_path)
    reference = peft_logits(demo_home / "model", run_dir / "output", prompts)
    assert max_difference(reference, merged) < MERGE_TOLERANCE
