"""Bundles carry or name their files (issue 31): the job's small local data rides in the bundle's data/ folder,
its job.yaml names it there, and README.md lists what stays on the machine that made it, with where to copy it.

The bundles are made as the page makes them (⬆ Upload data, then BundleWriter.write of the files on display)
and as `tunedeck export` writes them. tests/runs/test_bundle_data.py trains from such a bundle, unzipped alone.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import pytest
import yaml
from hostile.helpers import cli

from tunedeck.app.data_upload import fill_from_upload
from tunedeck.app.downloads import BundleWriter, zip_name_for
from tunedeck.backend import recipe
from tunedeck.backend.render import render_bundle, write_bundle, zip_bundle
from tunedeck.backend.render.bundle_data import bundle_files
from tunedeck.backend.render.carried import DATA_CAP_BYTES, DATA_NAME
from tunedeck.backend.spec import load_presets, resolve_spec, set_paths
from tunedeck.backend.spec.fields import values_from_spec

QA = [{"prompt": f"Q: {i} + 1\nA:", "completion": f" {i + 1}"} for i in range(40)]


def _jsonl(path: Path, rows: list = QA) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def _sized(path: Path, size: int) -> Path:
    """A file of `size` bytes that takes no room on disk (sparse): a bundle is planned by its files' sizes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as file:
        file.truncate(size)
    return path


def _uploaded(tmp_path: Path, names: list[str]):
    """The page's ⬆ Upload data of files with these names, over the 7B preset (its model a hub id)."""
    files = [str(_jsonl(tmp_path / "browser" / name, QA if "eval" not in name else QA[:8])) for name in names]
    return fill_from_upload(values_from_spec(resolve_spec("7b-lora-ddp")), files, tmp_path / "runs")


def _downloaded(tmp_path: Path, spec) -> tuple[dict[str, bytes], list[Path]]:
    """⬇ Download bundle as the page makes it: ({name in the zip: bytes}, each file alone)."""
    zip_path, paths = BundleWriter(tmp_path / "bundles").write(render_bundle(spec), zip_name_for(spec))
    with zipfile.ZipFile(zip_path) as archive:
        return {name: archive.read(name) for name in archive.namelist()}, paths


def test_an_uploaded_file_rides_in_the_zip_and_the_bundle_reads_it_there_once_the_upload_is_gone(tmp_path):
    spec, message = _uploaded(tmp_path, ["my chat data.jsonl"])
    kept = Path(spec.dataset.path)
    zipped, alone = _downloaded(tmp_path, spec)
    assert zipped["data/my_chat_data.jsonl"] == kept.read_bytes()
    job = yaml.safe_load(zipped["job.yaml"])
    shown = yaml.safe_load(render_bundle(spec)["job.yaml"])
    assert job["dataset"]["path"] == "./data/my_chat_data.jsonl"
    assert job == {**shown, "dataset": {**shown["dataset"], "path": "./data/my_chat_data.jsonl"}}  # and only that
    # Each file alone is what Start runs on this machine: the upload where the panel keeps it.
    assert yaml.safe_load(alone[0].read_text())["dataset"]["path"] == str(kept)
    readme = zipped["README.md"].decode()
    assert f"- `data/my_chat_data.jsonl`: dataset.path, 1.9 KiB, copied from `{kept}`" in readme
    assert "not carry" not in readme  # the model is a hub id: nothing stays behind
    assert "⬇ Download bundle carries it, in `data/my_chat_data.jsonl`." in message

    # Unzipped into another folder, the upload deleted: train_sft.py's own input checks find the data, from there.
    bundle = tmp_path / "elsewhere" / "bundle"
    with zipfile.ZipFile(next((tmp_path / "bundles").glob("*/*.zip"))) as archive:
        archive.extractall(bundle)
    for path in (kept, *(tmp_path / "browser").iterdir()):
        path.unlink()
    assert recipe.input_problems(job, bundle) == []
    assert recipe.input_problems(shown, bundle) == [("dataset.path", f"{kept} does not exist; fix the path")]


def test_a_training_file_with_its_held_out_file_rides_as_its_folder_of_splits(tmp_path):
    spec, _ = _uploaded(tmp_path, ["qa.jsonl", "qa-eval.jsonl"])
    folder = Path(spec.dataset.path)
    zipped, _ = _downloaded(tmp_path, spec)
    inside = f"data/{folder.name}"
    assert sorted(n for n in zipped if n.startswith("data/")) == [f"{inside}/train.jsonl", f"{inside}/validation.jsonl"]
    assert zipped[f"{inside}/validation.jsonl"] == (folder / "validation.jsonl").read_bytes()
    dataset = yaml.safe_load(zipped["job.yaml"])["dataset"]
    assert (dataset["path"], dataset["split"], dataset["eval_split"]) == (f"./{inside}", "train", "validation")


def test_data_within_the_cap_rides_and_the_rest_is_listed_with_its_size(tmp_path):
    big = _sized(tmp_path / "big.jsonl", DATA_CAP_BYTES + 1)
    near = _sized(tmp_path / "near.jsonl", DATA_CAP_BYTES - 1000)
    small = _jsonl(tmp_path / "small.jsonl")  # 1.9 KiB: more than the 1000 bytes left
    mix = [f"{near}#10", f"{small}:train#5"]
    spec = set_paths(resolve_spec("7b-lora-ddp"), {"dataset.path": str(big), "dataset.mix": mix})
    files, plan = bundle_files(spec)
    assert plan.files == {"data/near.jsonl": near}
    dataset = yaml.safe_load(files["job.yaml"])["dataset"]
    assert (dataset["path"], dataset["mix"]) == (str(big), ["./data/near.jsonl#10", f"{small}:train#5"])
    readme = files["README.md"]
    assert "- `data/near.jsonl`: dataset.mix, 50.0 MiB, copied from" in readme
    assert (
        f"- dataset.path: `{big}`, 50.0 MiB: more than the 50 MiB of data a bundle carries; "
        f"e.g. `rsync -aR {big} NODE:/`"
    ) in readme
    assert f"- dataset.mix: `{small}`, 1.9 KiB: more than the 1000 bytes left of the 50 MiB of data" in readme


def test_the_readme_lists_what_stays_on_this_machine_and_where_to_copy_it(tmp_path):
    model = tmp_path / "models" / "my model"
    _sized(model / "model.safetensors", 3 * 2**20)
    (model / "config.json").write_text("{}")
    reward = tmp_path / "rewards.py"
    reward.write_text("def score(completions, **kwargs):\n    return [0.0] * len(completions)\n")
    spec = set_paths(
        resolve_spec("demo-grpo"),
        {
            "model.name_or_path": str(model),
            "dataset.path": "/nowhere/prompts.jsonl",
            "grpo.rewards": ["exact_answer", f"{reward}:score"],
            "launch.num_machines": 2,
            "launch.num_processes": 4,
        },
    )
    files, plan = bundle_files(spec)
    assert plan.files == {} and files["job.yaml"] == render_bundle(spec)["job.yaml"]  # nothing to carry
    readme = " ".join(files["README.md"].split())  # its paragraphs as one line each
    assert "Copy each to the same path on every machine that trains (on every node of a Slurm job" in readme
    assert (
        f"- model.name_or_path: `{model}`, the base model's folder (3.0 MiB); e.g. `rsync -aR '{model}' NODE:/`"
    ) in readme
    assert "- dataset.path: `/nowhere/prompts.jsonl`, not on this machine: it must be at this path where" in readme
    assert f"- grpo.rewards: `{reward}`, your reward function's file (train_sft.py loads it from this" in readme


def test_a_job_that_reads_nothing_from_this_disk_gets_the_same_bundle_and_zip(tmp_path):
    for preset in ("7b-lora-ddp", "70b-qlora-zero3"):  # the golden files' presets: hub model, hub data
        spec = load_presets()[preset].build()
        files = render_bundle(spec)
        assert bundle_files(spec) == (files, bundle_files(spec)[1]) and not bundle_files(spec)[1].left
        zip_path, _ = BundleWriter(tmp_path).write(files, zip_name_for(spec))
        assert zip_path.read_bytes() == zip_bundle(files)


def test_each_file_alone_follows_every_edit_and_the_data_is_zipped_once_for_the_downloads(tmp_path):
    spec, _ = _uploaded(tmp_path, ["qa.jsonl"])
    writer = BundleWriter(tmp_path / "bundles")
    for rate in (1e-4, 2e-4):  # two edits: each file alone, without a zip (the data is read on the click)
        files = render_bundle(set_paths(spec, {"training.learning_rate": rate}))
        assert [path.read_text() for path in writer.write_files(files)] == list(files.values())
    assert not list((tmp_path / "bundles").rglob("*.zip"))
    for rate in (1e-4, 2e-4):  # two downloads: two zips, one zip of their data
        edited = set_paths(spec, {"training.learning_rate": rate})
        zip_path, _ = writer.write(render_bundle(edited), zip_name_for(edited))
        zipped, plan = bundle_files(edited)
        assert zip_path.read_bytes() == zip_bundle(zipped, plan.files)
    assert len(list((tmp_path / "bundles" / ".data").iterdir())) == 1


# Legal in a file name, and each means something to a shell, Markdown, a zip tool or the datasets library.
HOSTILE = ["$(touch x).jsonl", "`touch x`.jsonl", "'; touch x; '.jsonl", "..jsonl", ".hidden.jsonl", "-rf.jsonl"]
HOSTILE += ["ünï cödé.jsonl", "%2e%2e%2f..%2fescape.jsonl", "x" * 240 + ".jsonl", "*.jsonl", "train.JSONL"]


def test_names_from_the_disk_or_an_upload_never_lead_out_of_data_and_files_are_copied_not_linked(tmp_path):
    singles = [_jsonl(tmp_path / "singles" / name) for name in HOSTILE]  # each rides under a plain name
    # A folder rides with its names as they are (the datasets library reads its splits by them), hidden ones left
    # out as that library leaves them out; one holding names the bundle would have to change stays here.
    folder = tmp_path / "$(touch x) ..." / "..."
    for name in ("train.jsonl", "test/part-0.jsonl", ".hidden.jsonl", ".cache/x.jsonl"):
        _jsonl(folder / name)
    odd = tmp_path / "odd"
    for name in HOSTILE:
        _jsonl(odd / name)
    mix = [*map(str, singles), str(odd)]
    spec = set_paths(resolve_spec("7b-lora-ddp"), {"dataset.path": str(folder), "dataset.mix": mix})
    zipped, _ = _downloaded(tmp_path, spec)
    data = [name for name in zipped if name.startswith("data/")]
    assert data[:2] == ["data/data/train.jsonl", "data/data/test/part-0.jsonl"]
    assert len(set(data)) == 2 + len(HOSTILE) and all(DATA_NAME.match(name) for name in data)
    job = yaml.safe_load(zipped["job.yaml"])["dataset"]
    assert job["path"] == "./data/data" and job["mix"] == [f"./{name}" for name in data[2:]] + [str(odd)]
    assert f"- dataset.mix: `{odd}`, a folder holding a name other than letters, digits" in zipped["README.md"].decode()

    exported = tmp_path / "exported"
    files, plan = bundle_files(spec)
    write_bundle(files, exported, plan.files)
    on_disk = [p for p in exported.rglob("*") if p.is_file() or p.is_symlink()]
    assert sorted(str(p.relative_to(exported)) for p in on_disk) == sorted([*files, *data])
    assert not any(p.is_symlink() for p in on_disk)

    for name in ("data/../x", "../x", "data/.hidden", "data", "data//x", "/etc/x"):
        with pytest.raises(ValueError, match="refusing to write a data file"):
            zip_bundle({}, {name: singles[0]})
        with pytest.raises(ValueError, match="refusing to write a data file"):
            write_bundle({}, tmp_path / "refused", {name: singles[0]})
    assert not (tmp_path / "x").exists() and not (tmp_path / "refused" / "data").exists()


def test_a_linked_data_file_rides_as_a_copy_and_an_old_link_in_the_folder_is_replaced_not_written_through(tmp_path):
    real = _jsonl(tmp_path / "real" / "train.jsonl")
    link = tmp_path / "train.jsonl"
    link.symlink_to(real)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    exported = tmp_path / "exported"
    (exported / "data").mkdir(parents=True)
    (exported / "data" / "train.jsonl").symlink_to(victim)  # left there by someone else
    files, plan = bundle_files(set_paths(resolve_spec("7b-lora-ddp"), {"dataset.path": str(link)}))
    write_bundle(files, exported, plan.files)
    copied = exported / "data" / "train.jsonl"
    assert not copied.is_symlink() and copied.read_bytes() == real.read_bytes() and victim.read_text() == "keep me"

    # A folder holding a link does not ride (the datasets library would read what it points at): it is listed.
    (tmp_path / "real" / "linked.jsonl").symlink_to(victim)
    _, plan = bundle_files(set_paths(resolve_spec("7b-lora-ddp"), {"dataset.path": str(tmp_path / "real")}))
    assert plan.files == {} and [item.why for item in plan.left] == [
        "a folder holding a link; the bundle carries plain data files only"
    ]


def test_tunedeck_export_copies_the_data_into_the_folder_and_names_what_stays(tmp_path):
    model = tmp_path / "model"
    (model / "config.json").parent.mkdir()
    (model / "config.json").write_text("{}")
    data = _jsonl(tmp_path / "upload" / "qa.jsonl")
    out = tmp_path / "out"
    settings = {"model.name_or_path": str(model), "dataset.path": str(data), "dataset.format": "prompt-completion"}
    code, printed, said = cli("export", "7b-lora-ddp", *[f"--set={k}={v}" for k, v in settings.items()], "-o", str(out))
    assert code == 0, said
    assert (out / "data" / "qa.jsonl").read_bytes() == data.read_bytes()
    assert str(out / "data" / "qa.jsonl") in printed.splitlines()
    assert yaml.safe_load((out / "job.yaml").read_text())["dataset"]["path"] == "./data/qa.jsonl"
    assert f"note: model.name_or_path {model} is not in the bundle: the base model's folder (2 bytes)" in said
    assert f"`rsync -aR {model} NODE:/`" in (out / "README.md").read_text()
    os.remove(data)
    assert recipe.input_problems(yaml.safe_load((out / "job.yaml").read_text()), out) == []  # the data is in out/
