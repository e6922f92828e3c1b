"""README.md of a bundle: what each file is and how to run it without tunedeck."""

from __future__ import annotations

import shlex

from tunedeck.backend.recipe.objectives_table import OBJECTIVES
from tunedeck.backend.render.carried import DATA_CAP_WORDS, DataPlan, size_words
from tunedeck.backend.render.carried import code_span as _code
from tunedeck.backend.render.requirements import minimums
from tunedeck.backend.render.slurm_env import readme_lines
from tunedeck.backend.spec import JobSpec
from tunedeck.backend.validate import global_batch_terms

_FILE_ROLES = {
    "job.yaml": "the tunedeck job spec: model, method, LoRA, quantization, dataset (read by train_sft.py)",
    "accelerate_config.yaml": "accelerate's launch config: distributed type, processes, machines",
    "ds_config.json": 'DeepSpeed config; "auto" values are filled from training_args.yaml by transformers',
    "training_args.yaml": "TRL {config} keyword arguments, passed unchanged",
    "launch.sh": "the exact `accelerate launch` command",
    "slurm.sbatch": "the same job on a Slurm cluster: `sbatch slurm.sbatch` runs launch.sh once per node",
    "sky.yaml": "the same job as a SkyPilot task for Kubernetes and the clouds: `sky jobs launch sky.yaml` runs "
    "launch.sh once per node",
    "setup.sh": "the lines each Slurm node runs before launch.sh (launch.slurm.setup), sourced by slurm.sbatch",
    "train_sft.py": "the training script (TRL {trainer}: the job's objective is {objective}); needs only the Hugging Face stack",
    "tunedeck_recipe/": "the training recipe train_sft.py runs, a Python package of one module per job (its "
    "train_sft.py says what a run does and writes); needs only the Hugging Face stack",
    "requirements.txt": "the training stack at the versions tunedeck was tested with",
    "general-text.txt": "the general prose whose loss each evaluation measures too (dataset.general_text: built-in); "
    "a rise means the model is forgetting general language",
    "README.md": "this file",
}


def _data_lines(spec: JobSpec, plan: DataPlan) -> list[str]:
    """The data the bundle carries, and what it leaves on the machine that made it, with where to copy that."""
    lines = []
    if plan.carried:
        lines += [
            "",
            "## Data in this bundle",
            "",
            f"The job's local data files ride in `data/` (up to {DATA_CAP_WORDS} in all); job.yaml names them relative",
            "to this folder, which is where train_sft.py reads them: launch.sh and slurm.sbatch start it here, and",
            "`accelerate launch train_sft.py` must be started here too.",
            "",
            *[
                f"- `{item.name}`: {item.field}, {size_words(item.size)}, copied from {_code(item.source)}"
                for item in plan.carried
            ],
        ]
    if plan.left:
        where = "every machine that trains" if spec.launch.num_machines > 1 else "the machine that trains"
        lines += [
            "",
            "## Before you run: files this bundle does not carry",
            "",
            "job.yaml names these paths on the machine that made the bundle, and the job reads them there. Copy each",
            f"to the same path on {where} (on every node of a Slurm job, or on storage they all mount at",
            "that path), or copy it elsewhere and change its path in job.yaml (a relative path is taken from this",
            "folder). `rsync -aR PATH NODE:/` copies a path to the same path on the machine NODE.",
            "",
            *[
                f"- {item.field}: {_code(item.path)}, {item.why}"
                + (f"; e.g. {_code(_copy_line(item.here))}" if item.here else "")
                for item in plan.left
            ],
        ]
    return lines


def _copy_line(path: str) -> str:
    """A command that copies `path` to the same path on another machine (rsync's -R keeps the whole path)."""
    return f"rsync -aR {shlex.quote(path)} NODE:/"


def render_bundle_readme(spec: JobSpec, names: list[str], data: DataPlan | None = None) -> str:
    launch = spec.launch
    objective = OBJECTIVES[spec.objective]  # what it trains with: backend/recipe/objectives_table.py
    config, trainer = objective.config, objective.trainer
    role = {"config": config, "trainer": trainer, "objective": spec.objective}
    device = "CPU processes (gloo)" if launch.use_cpu else "GPUs"
    lines = [
        f"# {spec.method}{'' if spec.objective == 'sft' else ' ' + objective.title} fine-tuning of "
        f"{_code(spec.model.name_or_path)}",
        "",
        f"- Strategy: {spec.strategy.facts.title}"
        + (f", {spec.sequence_parallel} GPUs per sequence (Ulysses)" if spec.sequence_parallel > 1 else ""),
        f"- {launch.num_processes} {device} on {launch.num_machines} machine(s)",
        f"- Global batch: {spec.global_batch_size} sequences per optimizer step = {global_batch_terms(spec)}",
        f"- Output: {_code(spec.output_dir.rstrip('/') + '/')} (checkpoints and the final "
        f"{'adapter' if spec.uses_adapter else 'model'})",
        "",
        "## Files",
        "",
        *[f"- `{name}`: {_FILE_ROLES.get(name, '').format(**role)}" for name in names],
        *_data_lines(spec, data or DataPlan()),
        "",
        "## Run",
        "",
        "Install torch first (the build for your CUDA, at the version in `requirements.txt`), then the rest,",
        "then start the job in this folder:",
        "",
        "```bash",
        "pip install -r requirements.txt",
        "bash launch.sh",
        "```",
        "",
        "The generated files need at least these versions:",
        "",
        *[f"- {m.package} >= {m.version}: {m.reason}." for m in minimums(spec)],
    ]
    if spec.strategy.is_deepspeed and "nvme" in (spec.strategy.offload_params, spec.strategy.offload_optimizer):
        lines += [
            "",
            "NVMe offload runs through DeepSpeed's async_io op, which needs libaio on every machine "
            "(`apt-get install libaio-dev`, or `yum install libaio-devel`) before DeepSpeed builds it; "
            "`ds_report` then shows async_io as compatible.",
        ]
    if launch.num_machines > 1:
        lines += [
            "",
            f"On each of the {launch.num_machines} machines, with the same files, run "
            "`MACHINE_RANK=<0..N-1> MAIN_PROCESS_IP=<address of machine 0> bash launch.sh`.",
        ]
    lines += ["", "On a Slurm cluster, submit from this folder instead: `sbatch slurm.sbatch`.", *readme_lines(spec)]
    lines += [
        "",
        "On Kubernetes or a cloud, through SkyPilot (`pip install skypilot`, then `sky check` to enable your infra),",
        "from this folder: `sky jobs launch sky.yaml`. SkyPilot copies this folder to each node, installs",
        "requirements.txt there and runs launch.sh with the node's rank; `sky jobs queue` and `sky jobs logs` follow it,",
        "`sky jobs cancel` stops it. Checkpoints stay on the nodes unless output_dir is on storage that outlives them.",
    ]
    if "train_sft.py" not in names:
        lines += ["", "This bundle has no `train_sft.py` yet: add the training script next to these files."]
    return "\n".join(lines) + "\n"
