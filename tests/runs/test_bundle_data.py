"""A bundle made from an uploaded file trains from the unzipped bundle alone, in another folder (issue 31).

The page's ⬆ Upload data keeps the files under the runs folder; ⬇ Download bundle used to name them there, so
the bundle died at data loading anywhere else. Here the zip the page makes is unzipped elsewhere, the upload
and the panel's folders are deleted, tunedeck's packages are made unimportable, and the bundle's own launch.sh
trains 2 ranks on the data the zip carries. tests/spine/test_bundle_data.py checks the bundle's files.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tunedeck.app.data_upload import fill_from_upload
from tunedeck.app.downloads import BundleWriter, zip_name_for
from tunedeck.backend.render import render_bundle
from tunedeck.backend.spec.fields import values_from_spec

from .helpers import end_record, log_records, logs_tail, read_metrics, start_record

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

BIN = Path(sys.executable).parent


def test_a_bundle_made_from_an_uploaded_file_trains_from_the_unzipped_bundle_alone(tmp_path, demo_home, demo_spec):
    # ⬆ Upload data: a training file with its held-out file, from the browser's machine.
    rows = (demo_home / "data" / "train.jsonl").read_text().splitlines(keepends=True)
    browser = tmp_path / "browser"
    browser.mkdir()
    (browser / "my qa.jsonl").write_text("".join(rows[:300]))
    (browser / "my qa eval.jsonl").write_text("".join(rows[300:316]))
    mixed = tmp_path / "more" / "extra.jsonl"  # and a local file mixed in, typed into dataset.mix
    mixed.parent.mkdir()
    mixed.write_text("".join(rows[316:416]))
    job = demo_spec(
        {
            "training.max_steps": 3,
            "training.eval_steps": 3,
            "training.save_steps": 3,
            "dataset.mix": [f"{mixed}#50"],
        }
    )
    spec, said = fill_from_upload(values_from_spec(job), [str(p) for p in browser.iterdir()], tmp_path / "runs")
    assert spec is not None, said

    # ⬇ Download bundle, as the page makes it; unzipped on "the cluster", where nothing else of this machine is.
    zip_path, _ = BundleWriter(tmp_path / "bundles").write(render_bundle(spec), zip_name_for(spec))
    bundle = tmp_path / "cluster" / "bundle"
    with zipfile.ZipFile(zip_path) as archive:
        archive.extractall(bundle)
    for folder in (tmp_path / "runs", browser, mixed.parent, tmp_path / "bundles"):
        shutil.rmtree(folder)

    poison = tmp_path / "poison"  # packages named like tunedeck's, first on the path, that refuse to be imported
    for package in ("backend", "app", "tunedeck"):
        (poison / package).mkdir(parents=True)
        (poison / package / "__init__.py").write_text("raise ImportError('the bundle must not import tunedeck')\n")
    env = {
        "PATH": f"{BIN}:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "PYTHONPATH": str(poison),
        "HF_HUB_OFFLINE": "1",
    }
    result = subprocess.run(
        ["bash", str(bundle / "launch.sh")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:] + logs_tail(bundle)
    start = start_record(bundle)
    assert start["world_size"] == 2 and start["model_class"] == "DistributedDataParallel"
    assert start["dataset_rows"] == {"dataset.path": 300, "./data/extra.jsonl#50": 50}  # the upload, and the mix
    assert [r["step"] for r in log_records(bundle)] == [1, 2, 3]
    assert [r["step"] for r in read_metrics(bundle) if "eval_loss" in r] == [3]  # on the held-out upload
    assert end_record(bundle)["status"] == "finished"
    assert (bundle / "output" / "adapter_model.safetensors").is_file()
