"""tunedeck's training entrypoint: TRL's SFTTrainer (DPOTrainer, KTOTrainer, GRPOTrainer) under `accelerate launch`.

    accelerate launch --config_file accelerate_config.yaml train_sft.py \
        --job job.yaml --training-args training_args.yaml [--run-dir DIR]

This package ships in every exported bundle as the folder tunedeck_recipe/ beside a few-line train_sft.py that
calls main() here, so it depends only on the Hugging Face stack and PyYAML, never on tunedeck: its modules import
the standard library, each other (relatively: the package works under any name) and, inside the functions that
need them, torch, transformers, TRL, PEFT and datasets. job.yaml is read as a plain dict
(model, method, objective, lora, quantization, dataset, grpo); training_args.yaml holds the keyword
arguments of trl.SFTConfig (DPOConfig, KTOConfig, GRPOConfig by objective) and is passed unchanged: what
you read is what runs. Like torchtune's recipes it is standalone; unlike one long file, each module has one job:
records (the run folder's files), models, formats, data, checks, rewards, describe (what the run got), speed
(MFU), gate, watchdog, recorder (the callback that records it all), checkpoints, objectives, notify; this one
reads the arguments and runs them in order.

Before its first step every run passes a sanity gate: it compares what it got with
job.yaml and stops every rank on a difference ("asked 2 processes on 1 machine, got 1").

What it writes in the run folder (DIR, default the current folder; relative paths in
both YAML files are taken from there):
  metrics.jsonl     rank 0 only: {"event": "start"} with what the run actually got (world
                    size, each rank's node, accelerate's distributed type, ZeRO stage, FSDP
                    version, wrapped model class, 4-bit modules, parameter counts, memory
                    peaks after loading, what a resume restored, the gate's verdict, the GPU's peak TFLOPS or why MFU is not
                    defined), one {"event": "log"} per logging step (with mfu and hfu when the peak
                    is known), and
                    {"event": "end"} with the status (finished | stopped | failed)
  startup.json      rank 0: {"host", "phases": [{"phase", "at"}]}: each phase before its first step
                    (loading the model, tokenizing the data, ...) as it begins, "training" last; every
                    other rank writes its own to logs/rank<N>.startup.json
  progress.json     rank 0 only: {"step", "micro", "time", "saving"}: its last finished step and
                    micro-batch, rewritten as each ends: tunedeck's supervisor calls a run stalled
                    when it stops changing
  logs/rank<N>.log  each rank's stdout and stderr; SIGUSR1 makes a rank write every thread's
                    Python stack there (`tunedeck runs stacks` sends it), as its stall watchdog does
  answers.jsonl     rank 0 only, GRPO: at each logging step the answers the model just wrote to two
                    prompts, each with its rewards and advantage ({"step", "groups": [{"prompt",
                    "answers": [{"text", "rewards", "advantage"}]}]})
  errors.jsonl      one line per rank that failed (rank, time, error, traceback)
  telemetry/<host>.jsonl  the first process on each machine: its GPUs (NVML) and host every few seconds
                    (telemetry.py)
  <output_dir>/     checkpoints and the final adapter or model

SIGTERM or SIGINT: every rank finishes its current step, a checkpoint is saved, the run
ends as "stopped".

With TUNEDECK_NOTIFY_URL set (a Slack, Discord or Teams incoming webhook, an ntfy topic, any
endpoint of yours), rank 0 POSTs how the run ended there as JSON ({"text", "content", "run",
"state", "step", "max_steps", "loss", "error", "runtime_s"}) once its end record is written, within
10 s all told; an environment variable, not a job field, because such URLs are secrets and job files
travel. tunedeck's supervisor keeps the variable from the ranks and posts itself, after the run's
final state (a rank 0 killed outright, by the OOM killer, sends nothing).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

from .checkpoints import resume_checkpoint, with_atomic_checkpoints
from .checks import input_problems
from .data import load_datasets
from .describe import load_peaks
from .failures import ATTEMPT_ENV
from .faults import with_faults
from .gate import check_processes, expected_run, expected_trainable
from .general_text import general_text_set, with_general_text
from .health import Unhealthy
from .job import JobError, read_yaml
from .models import leave_out_unused_bitsandbytes, load_model, load_tokenizer, peft_config
from .network import measure_network
from .network import wanted as network_wanted
from .notifications import notify
from .objectives import REFERENCE_OBJECTIVES, fsdp_launch, objective_classes, trainer_class
from .rank_timing import RankTiming
from .ranks import gather_from_ranks, global_rank, node_name
from .recorder import make_callback
from .records import ERRORS_FILE, METRICS_FILE, JsonlWriter, StartupPhases, StopRequest, redirect_output
from .reshard import load_universal_if_reshaped
from .restore import data_parallel_size, with_restored_position
from .rewards import reward_functions
from .rollback import ROLLBACK_EXIT, current_rollback, rollback_checkpoint, with_rollback_window
from .source_loss import SourceLosses, tracks_sources, with_source_loss
from .telemetry import TelemetrySampler
from .watchdog import IMPORTING_REWARDS, watched_phase


def train(job: dict, training_args: dict, metrics, stop: StopRequest, terminal, startup: StartupPhases) -> str:
    """Run the job; returns "finished" or "stopped"."""
    startup.enter("importing the libraries")
    problems = input_problems(job, Path.cwd())  # a missing model or bad data rows: named before any library sees them
    if problems:
        raise JobError("\n".join(f"{field}: {message}" for field, message in problems))
    expected = expected_run(job)
    check_processes(expected)  # a lone process stops here, before anything heavy
    from accelerate import PartialState

    config_class, trainer_base = objective_classes(job)
    expected["trainable_params"] = expected_trainable(job)  # before SFTConfig: see expected_trainable
    startup.enter("joining the other processes")
    args = config_class(**training_args)  # the process group forms here: every rank waits for the others
    # The process group exists: wrong counts or a missing engine stop here, before the model loads.
    check_processes(expected, str(PartialState().distributed_type.value))
    network = None
    if network_wanted(job):  # on several machines, or when asked
        startup.enter("measuring the network")
        network = measure_network(job, gather_from_ranks(node_name()))
    extra = {}
    if job.get("objective") == "grpo":
        # The rewards score the answers the model writes; a KL weight (beta > 0) makes TRL load the reference itself.
        # Your reward modules run their own code as they are imported: before the model loads, and watched.
        with watched_phase(job, Path.cwd(), startup, IMPORTING_REWARDS):
            extra["reward_funcs"] = reward_functions(job)
    startup.enter("loading the model")
    tokenizer = load_tokenizer(job)
    model = load_model(job, args)
    precomputed = getattr(args, "precompute_ref_log_probs", False)
    if job.get("objective") in REFERENCE_OBJECTIVES and peft_config(job) is None and (not precomputed or fsdp_launch()):
        # Full DPO and KTO score against a frozen copy of the base, loaded as the model is (dtype, quantization,
        # revision; ZeRO-3 shards it as it loads); with adapters the base with the adapters off is the reference.
        # Scores computed before training need no copy (the model scores the rows before its first step), but
        # under FSDP the model is sharded only when training starts: a sharded copy scores them, then goes.
        startup.enter("loading the reference model")
        extra["ref_model"] = load_model(job, args)
    startup.enter("loading the data")
    train_set, eval_set, rows = load_datasets(job, args, tokenizer)
    general_text = general_text_set(job, tokenizer, Path.cwd()) if eval_set is not None else None
    recorder = make_callback(metrics, stop, job, terminal, expected)
    recorder.network = network
    recorder.startup = startup
    recorder.load_peaks = load_peaks()
    recorder.dataset_rows = rows
    # TRL's trainers tokenize in their constructor (GRPO's does not); DPO's and KTO's score every row with the
    # reference there when the scores are computed before training.
    scoring = ", then scoring every row with the reference" if precomputed else ""
    startup.enter(("tokenizing the data" if job.get("objective") != "grpo" else "building the trainer") + scoring)
    rollback = current_rollback()  # an attempt after a roll-back: its checkpoint, the data window it skips
    trainer_type = with_faults(with_atomic_checkpoints(with_restored_position(trainer_class(trainer_base))))
    by_source = tracks_sources(job, rows)
    if by_source:
        trainer_type = with_source_loss(trainer_type)
    if general_text is not None:  # its loss at each evaluation, beside the held-out rows'
        trainer_type = with_general_text(trainer_type, general_text)
    trainer = with_rollback_window(trainer_type, int((rollback or {}).get("skip_steps", 0)))(
        **extra,
        model=model,
        args=args,
        train_dataset=train_set,
        eval_dataset=eval_set,
        processing_class=tokenizer,
        peft_config=peft_config(job),
        callbacks=[recorder],
    )
    if job.get("objective") == "grpo":  # minutes of writing answers inside one micro-batch are no stall
        trainer.model.get_input_embeddings().register_forward_hook(lambda *_: recorder.forward_done())
    if precomputed and extra:  # the scores are in the datasets now: free the copy (TRL keeps one it was given)
        extra.clear()
        trainer.ref_model = None
    recorder.trainer = trainer
    if by_source:  # each source's loss, at logging and evaluation steps
        recorder.source_losses = SourceLosses(trainer, list(rows))
    if job.get("objective") != "grpo":  # GRPO's forward passes are mostly its answers being written
        recorder.rank_timing = RankTiming(trainer)
    startup.enter("preparing the model and optimizer")  # DeepSpeed or FSDP wraps it; DeepSpeed may compile ops
    if rollback:  # after a failure too (TUNEDECK_ATTEMPT): the roll-back's scale and window stay
        checkpoint = rollback_checkpoint(rollback, args.output_dir, restarted=bool(os.environ.get(ATTEMPT_ENV)))
    else:
        checkpoint = resume_checkpoint(args, job)
    recorder.resumed = (checkpoint, load_universal_if_reshaped(trainer, checkpoint, data_parallel_size(trainer)))
    trainer.train(resume_from_checkpoint=checkpoint)
    if recorder.stopped_early:
        return "stopped"
    if trainer.is_fsdp_enabled:
        # Trainer.save_model writes nothing under FSDP unless the state dict is FULL (checkpoints
        # may stay sharded): gather the final adapter/model into one loadable file.
        trainer.accelerator.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")
    trainer.save_model()  # every rank calls it (ZeRO-3 and FSDP gather); only rank 0 writes
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(args.output_dir)
    return "finished"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--job", type=Path, default=Path("job.yaml"), help="job spec YAML (default job.yaml)")
    parser.add_argument(
        "--training-args",
        type=Path,
        default=Path("training_args.yaml"),
        help="trl.SFTConfig (DPOConfig, KTOConfig, GRPOConfig) kwargs YAML",
    )
    parser.add_argument("--run-dir", type=Path, default=None, help="run folder (default: the current folder)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    job_path, args_path = args.job.resolve(), args.training_args.resolve()
    run_dir = (args.run_dir or Path.cwd()).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    os.chdir(run_dir)  # relative paths (output_dir, data files) are from the run folder
    rank = global_rank()
    stop = StopRequest(run_dir)
    stop.install()
    terminal = redirect_output(run_dir, rank)
    metrics = JsonlWriter(run_dir / METRICS_FILE) if rank == 0 else None
    started = time.monotonic()
    status, error, health = "failed", None, None
    telemetry = TelemetrySampler(run_dir).start()  # this machine's GPUs and host, from its first process
    try:
        job = read_yaml(job_path, "job spec")
        training_args = read_yaml(args_path, "training arguments")
        leave_out_unused_bitsandbytes(job, training_args)
        status = train(job, training_args, metrics, stop, terminal, StartupPhases(run_dir, rank))
    except Unhealthy as exc:  # the health guard stopped the run, or ends this attempt for a roll-back
        status, error, health = "failed", str(exc), exc.symptom
        if exc.action == "rollback":
            status = "rollback"
        print(f"error: {error}" if status == "failed" else str(exc), file=sys.stderr)
    except BaseException as exc:  # noqa: BLE001 - every failure must end the run's record
        if isinstance(exc, JobError):  # the user's input: the message says it all
            error, trace = str(exc), None
            print(f"error: {error}", file=sys.stderr)
        else:
            error, trace = (f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__), traceback.format_exc()
            traceback.print_exc()
        JsonlWriter(run_dir / ERRORS_FILE).write(
            {"rank": rank, "time": time.time(), "error": error, "traceback": trace}
        )
    if metrics:
        metrics.write(
            {
                "event": "end",
                "time": time.time(),
                "status": status,
                "runtime_s": time.monotonic() - started,
                "error": error,
                "health": vars(health) if health else None,  # the guard's symptom, when it ended the run
            }
        )
    telemetry.stop()
    if terminal:
        print(f"run {status}" + (f": {error}" if error else ""), file=terminal)
    _close_process_group(clean=status != "failed")  # first: the other ranks never wait on a webhook
    if rank == 0:  # after the end record, and bounded in time (under tunedeck's supervisor, it posts instead)
        notify(run_dir, status, error, time.monotonic() - started)
    return {"failed": 1, "rollback": ROLLBACK_EXIT}.get(status, 0)


def _close_process_group(clean: bool) -> None:
    """End every process group now, while the interpreter is whole.

    Without the barrier, ranks tearing down at different moments occasionally abort at exit. A group
    that outlives this call is destroyed in the interpreter's teardown, where a gloo thread calling
    into Python can abort the process after the run has finished (the likely cause of "terminate
    called without an active exception" after a finished Ulysses run, seen once in CI). DeepSpeed
    keeps its own references to the groups it made (Ulysses' sequence groups among them): its
    destroy_process_group releases them, torch's does not; gc.collect() then frees the trainer's
    cycles that still hold a group.
    """
    import gc

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        try:
            if clean:
                dist.barrier()
            deepspeed_comm = sys.modules.get("deepspeed.comm")
            if deepspeed_comm is not None and deepspeed_comm.is_initialized():
                deepspeed_comm.destroy_process_group()
            else:
                dist.destroy_process_group()
        except Exception as exc:  # noqa: BLE001 - the end is recorded: a peer gone first must not fail this rank
            print(f"warning: closing the process group: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    gc.collect()


if __name__ == "__main__":
    sys.exit(main())
