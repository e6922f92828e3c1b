"""Which data a run is evaluated on, and what a person is told about it, without reading the rows.

The data: a chosen file (in the run's dataset format), else the job's dataset.eval_split, else the
held-out file beside the training file (a folder's: beside its train file), found as datasets
splits a folder by file name (eval/test/validation beside train). Without any, NoEvalData says so
and what to do, in the words of the front end that asks: the CLI's flag (`--data FILE`) or the
page's boxes. The page may then evaluate on rows sampled from the training file
(`sample_training_rows`): the model trained on them, and the page says so, as it does when the
evaluation file is the training file itself (`seen_in_training`).
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Literal

from tunedeck.backend.runs.checkpoints import AfterError
from tunedeck.backend.spec import JobSpec

Words = Literal["cli", "page"]
SAMPLES_DIR = "eval-data"  # under the run folder: the training rows sampled for an evaluation
SAMPLE_SEED = 0  # the same rows each time, so two evaluations on N rows compare
HASH_CHUNK = 1 << 20


class EvalDataError(AfterError):
    """Evaluation data that cannot be used; str() is the CLI's words, `said("page")` the page's."""

    def __init__(self, words: dict[str, str]):
        self.words = words
        super().__init__(words["cli"])

    def said(self, to: Words) -> str:
        return self.words[to]


class NoEvalData(EvalDataError):
    """The run's job names no evaluation data and none lies beside its training file."""

    def __init__(self, train_file: Path):
        self.train_file = train_file
        super().__init__(
            {
                "cli": "the run has no evaluation data: its job has no dataset.eval_split and there is no eval, test or "
                f"validation file beside {train_file}; pass --data FILE (in the run's dataset format)",
                "page": "This run kept no held-out rows: its job has no evaluation split and no eval, test or "
                f"validation file lies beside {train_file.name}. Upload an evaluation file in the box above (in the "
                "run's dataset format), or press Evaluate on training rows (rows the model has seen).",
            }
        )


def not_a_file(data_file: str) -> EvalDataError:
    return EvalDataError(
        {
            "cli": f"--data: {data_file} is not a file; give a JSON/JSONL/CSV/Parquet file in the run's dataset format",
            "page": f"Evaluation data: {Path(data_file).name} is no longer there; upload it again",
        }
    )


def local(base: Path, path: str) -> Path:
    """`path` from `base` (a run folder) where it exists there, else as given."""
    candidate = Path(base) / Path(path).expanduser()
    return candidate.resolve() if candidate.exists() else Path(path).expanduser()


def training_file(run_dir: Path, job: JobSpec) -> Path:
    """The run's training file: dataset.path, or, for a folder of split files, its train file."""
    path = local(run_dir, job.dataset.path)
    if path.is_dir():  # a folder of split files (the GRPO, DPO and KTO demos'): its train file
        path = next(iter(sorted(path.glob("train.*"))), path)
    return path


def held_out_file(train_file: Path) -> Path | None:
    """The eval/test/validation file beside a training file, as datasets' get_data_patterns names the splits."""
    from datasets.data_files import DataFilesDict, get_data_patterns

    folder = train_file.parent
    try:
        files = DataFilesDict.from_patterns(get_data_patterns(str(folder)), base_path=str(folder))
    except FileNotFoundError:  # datasets' EmptyDatasetError and DataFilesNotFoundError: no split files here
        return None
    if str(train_file.resolve()) not in {str(Path(f).resolve()) for f in files.get("train", [])}:
        return None
    for split in ("validation", "test"):
        candidates = [Path(f) for f in files.get(split, []) if Path(f).suffix == train_file.suffix]
        if len(candidates) == 1:
            return candidates[0]
    return None


def eval_source(run_dir: Path, job: JobSpec, data_file: str | None = None) -> tuple[dict, str, str]:
    """(the dataset config that reads the evaluation data, its split, where it comes from in words)."""
    dataset_cfg = job.dataset.model_dump(mode="json")  # what the recipe's loaders read
    if data_file:
        path = local(Path.cwd(), data_file)
        if not path.is_file():
            raise not_a_file(data_file)
        dataset_cfg["path"] = str(path)
        return dataset_cfg, "train", str(path)
    if dataset_cfg.get("eval_split"):
        dataset_cfg["path"] = str(local(run_dir, str(dataset_cfg.get("path", ""))))
        return dataset_cfg, dataset_cfg["eval_split"], f"{dataset_cfg['path']} [{dataset_cfg['eval_split']}]"
    train_file = training_file(run_dir, job)
    found = held_out_file(train_file) if train_file.is_file() else None
    if found is None:
        raise NoEvalData(train_file)
    dataset_cfg["path"] = str(found)
    return dataset_cfg, "train", str(found)


def _digest(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(HASH_CHUNK):
            sha.update(chunk)
    return sha.hexdigest()


def same_file(a: Path, b: Path) -> bool:
    """The same file, or the same bytes (a copy); the content is read only when the sizes agree."""
    try:
        if a.resolve() == b.resolve():
            return True
        return a.is_file() and b.is_file() and a.stat().st_size == b.stat().st_size and _digest(a) == _digest(b)
    except OSError:
        return False


def seen_in_training(run_dir: Path, job: JobSpec, source: str) -> str | None:
    """Why the model has seen the evaluation data `source` in training, in the page's words, or None."""
    path = Path(source)
    if path.parent == Path(run_dir).resolve() / SAMPLES_DIR:
        return f"{path.name} holds rows sampled from the run's training file"
    if path.is_file() and same_file(path, training_file(run_dir, job)):
        return f"{path.name} is the run's training file ({training_file(run_dir, job).name}, the same content)"
    return None


def seen_warning(reason: str) -> str:
    """The page's warning for evaluation data the model trained on: what the scores then mean, and the way out."""
    return (
        f"⚠ {reason}: the model trained on these rows, so the scores show what it learned, not how it answers "
        "rows it has not seen. To keep rows out of training, set the Evaluation split (`dataset.eval_split`) to "
        "train[95%:] and the Training split (`dataset.split`) to train[:95%] before the next run, or upload a "
        "held-out file with the training file."
    )


def sample_training_rows(run_dir: Path, job: JobSpec, rows: int) -> Path:
    """`rows` rows of the run's training split, sampled (the same each time), written as JSONL under the run
    folder; the evaluation reads them in the run's dataset format (their columns are the file's)."""
    from tunedeck.backend import recipe

    if rows < 1:
        raise AfterError("training rows: give a number of rows above 0, e.g. 50")
    dataset_cfg = job.dataset.model_dump(mode="json")  # what the recipe's loaders read
    dataset_cfg["path"] = str(local(run_dir, job.dataset.path))
    try:
        dataset = recipe.load_split(dataset_cfg, dataset_cfg.get("split") or "train")
    except recipe.JobError as exc:
        raise AfterError(str(exc)) from None
    except (OSError, ValueError) as exc:
        raise AfterError(f"cannot read the training data {dataset_cfg['path']}: {exc}") from None
    picked = sorted(random.Random(SAMPLE_SEED).sample(range(len(dataset)), min(rows, len(dataset))))
    out = Path(run_dir) / SAMPLES_DIR / f"training-rows-{len(picked)}.jsonl"
    out.parent.mkdir(exist_ok=True)
    dataset.select(picked).to_json(str(out), lines=True, force_ascii=False)
    return out
