"""Pure generators: a JobSpec in, the files the Hugging Face stack reads out (no torch, no accelerate).

The face: the panel, the CLI and the run side import these names from `tunedeck.backend.render`, never its
modules. render_bundle(spec) -> {file name: text}, in display order (bundle.py); each file comes from one small
module (accelerate_yaml, deepspeed_json, training_args, launch, slurm, requirements, bundle_readme, serve) and the
recipe package it ships from recipe_files.py. A bundle that carries the job's local data has them in data/ besides
its files (bundle_data.py, carried.py); bundle_check.py checks a bundle as the libraries will read it.
"""

from tunedeck.backend.render.bundle import render_bundle, write_bundle, zip_bundle, zip_data, zip_files
from tunedeck.backend.render.bundle_check import BundleCheckError, check_bundle
from tunedeck.backend.render.bundle_data import bundle_files, carry, plan_data
from tunedeck.backend.render.carried import DATA_CAP_WORDS, DataPlan
from tunedeck.backend.render.serve import SERVE_FILE

__all__ = [
    "DATA_CAP_WORDS",
    "SERVE_FILE",
    "BundleCheckError",
    "DataPlan",
    "bundle_files",
    "carry",
    "check_bundle",
    "plan_data",
    "render_bundle",
    "write_bundle",
    "zip_bundle",
    "zip_data",
    "zip_files",
]
