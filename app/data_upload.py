"""The page's ⬆ Upload data: the files go where runs read them (backend/data/uploads.py) and the job points at them."""

from __future__ import annotations

from pathlib import Path

from tunedeck.app.untrusted_text import as_text, code_span
from tunedeck.backend.data import UploadError, dataset_changes, keep_upload
from tunedeck.backend.render import DATA_CAP_WORDS, plan_data
from tunedeck.backend.spec import JobSpec, SpecError, Values, shown, spec_from_values

COLUMNS_LISTED = 20  # of the first row's columns (up to data_sniff.MAX_COLUMNS), in the notice

# Said when the upload's format changed the objective.
OBJECTIVE_SAID = {
    "dpo": "preference pairs train with DPO (the Training section's Beta and loss are DPO's).",
    "kto": "answers labelled good or bad train with KTO (the Training section's Beta and weights are KTO's).",
    "sft": "these rows train with SFT, not preference training.",
    "grpo": "prompts alone train with GRPO: the model writes the answers and the rewards score them against the "
    "`answer` column (the Training section's GRPO settings: answers per prompt, answer length, rewards).",
}


def fill_from_upload(
    values: Values, uploaded: list[str] | str | None, runs_dir: Path | None
) -> tuple[JobSpec | None, str]:
    """(the job with its dataset on the uploaded files, what was done) or (None, why nothing changed)."""
    files = [Path(p) for p in ([uploaded] if isinstance(uploaded, str) else uploaded or [])]
    if runs_dir is None:
        return (
            None,
            "✗ This panel has no runs folder to keep uploaded data in; start it with `tunedeck ui --runs-dir DIR`.",
        )
    try:
        kept, held_out = keep_upload(files, runs_dir)
    except UploadError as exc:
        return None, f"✗ {as_text(str(exc))}; the form is unchanged."
    except OSError as exc:
        return (
            None,
            f"✗ data upload: could not keep the files ({as_text(exc.strerror or str(exc))}); the form is unchanged.",
        )
    changes, found, columns = dataset_changes(kept, held_out, values.get("objective") or "sft")
    try:
        spec = spec_from_values({**values, **changes})
    except SpecError:
        return None, (
            f"Kept the data in {code_span(kept)}, but the form has errors, so the job was not changed: fix them "
            "and upload again (the same files are not copied twice)."
        )
    names = ", ".join(f"**{as_text(shown(f.name))}**" for f in files)
    said = [f"Uploaded {names} to {code_span(kept)}: dataset.path points there.", in_the_bundle(spec)]
    if held_out:
        said.append(
            "The second file is the evaluation split (`validation`): eval loss during training, and Evaluate's data."
        )
    else:
        said.append(
            "No held-out file: no evaluation during training. Upload one together with the training file, or "
            "press **Fix** beside its warning in the problems list to hold out rows of this one."
        )
    columns = columns or []
    listed = ", ".join(as_text(shown(c)) for c in columns[:COLUMNS_LISTED])
    if len(columns) > COLUMNS_LISTED:
        listed += f" and {len(columns) - COLUMNS_LISTED:,} more"
    if found:
        said.append(f"Row format **{found}** (its columns: {listed}).")
        if spec.objective != values.get("objective", spec.objective):
            said.append(f"Objective **{spec.objective}**: " + OBJECTIVE_SAID[spec.objective])
    else:
        said.append(
            f"Its columns ({listed or 'not read here: Parquet'}) are no format's own: set dataset.format and its column "
            "fields; the dataset preview then measures it."
        )
    return spec, " ".join(said)


def in_the_bundle(spec: JobSpec) -> str:
    """What ⬇ Download bundle does with the uploaded data: carries it in data/, or names it in its README.md."""
    carried = next((item for item in plan_data(spec).carried if item.field == "dataset.path"), None)
    if carried:
        return f"⬇ Download bundle carries it, in {code_span(carried.name)}."
    return (
        f"It is more than the {DATA_CAP_WORDS} of data a downloaded bundle carries: the bundle's README.md names it, "
        "to copy to the machines that train."
    )
