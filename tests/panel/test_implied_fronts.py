"""One set of rules: a field that implies others sets them the same way in the page's form and in the CLI's --set
(backend/spec/implied.py), so `tunedeck export PRESET --set ...` writes the bundle the page shows for the same edit."""

from __future__ import annotations

import gradio as gr
import pytest

from tunedeck.app.downloads import BundleWriter
from tunedeck.app.form import build_form
from tunedeck.app.job_events import JobShown
from tunedeck.app.job_view import JobView
from tunedeck.app.registry import Registry
from tunedeck.backend.cli import main
from tunedeck.backend.render import render_bundle
from tunedeck.backend.spec import JobSpec, flat_values, load_presets, set_paths
from tunedeck.backend.spec.fields import FORM_FIELDS, values_from_spec
from tunedeck.backend.spec.implied import RULES

# (preset, the fields a person changes): between them every rule of backend/spec/implied.py fires at least once
# (test_every_rule_is_covered), in both directions where a rule has two.
EDITS = [
    ("7b-lora-ddp", {"method": "qlora"}),  # QLoRA loads a 4-bit NF4 base
    ("70b-qlora-zero3", {"method": "lora"}),  # and only QLoRA does
    ("70b-qlora-zero3", {"model.dtype": "float16", "training.precision": "fp16"}),  # sharded 4-bit: one dtype
    ("7b-full-zero2", {"strategy.kind": "fsdp"}),  # FSDP's activation checkpointing for a full fine-tune
    ("13b-lora-fsdp", {"strategy.kind": "ddp"}),  # and the Trainer's without FSDP
    ("70b-qlora-zero3", {"strategy.kind": "fsdp"}),  # a 4-bit base loads on every rank
    ("7b-full-zero2", {"strategy.sequence_parallel": 2}),  # Ulysses under SDPA: no packing
    ("7b-full-zero2", {"strategy.sequence_parallel": 2, "strategy.kind": "ddp"}),  # only DeepSpeed splits sequences
]


def _rules_fired(preset: str, changes: dict) -> set[str]:
    values = {**flat_values(load_presets()[preset].build()), **changes}
    fired = set()
    for triggers, rule in RULES:
        if triggers & set(changes) and (found := rule(values)) is not None:
            values.update(found.changes)
            fired.add(rule.__name__)
    return fired


def test_every_rule_is_covered():
    fired = set().union(*(_rules_fired(preset, changes) for preset, changes in EDITS))
    assert fired == {rule.__name__ for _, rule in RULES}, "add an edit to EDITS for each new rule"


@pytest.fixture(scope="module")
def view(tmp_path_factory):
    spec = JobSpec()
    with gr.Blocks():
        ui = Registry()
        form = build_form({f.path: f.to_form(v) for f, v in zip(FORM_FIELDS, values_from_spec(spec).values())}, ui)
        view = JobView(ui, form, list(render_bundle(spec)), BundleWriter(tmp_path_factory.mktemp("bundles")))
        view.build_status()
        view.build_files()
    return view


def _page_bundle(view: JobView, preset: str, changes: dict) -> dict[str, str]:
    """The files the page shows after a person loads `preset` and then changes `changes` in the form."""

    def got(spec, shown: JobShown, fills: int) -> dict:
        widgets = [f.to_form(v) for f, v in zip(FORM_FIELDS, values_from_spec(spec).values())]
        return {**dict(zip(view.form.components, widgets)), view.shown: shown, view.fills: fills}

    loaded = load_presets()[preset].build()
    shown = view.on_fill(loaded, view.event(got(JobSpec(), JobShown(), 0)))[view.shown]
    edited = view.on_edit(got(set_paths(loaded, changes), shown, 1))
    return edited[view.shown].files


@pytest.mark.parametrize(("preset", "changes"), EDITS, ids=[f"{p}:{','.join(c)}" for p, c in EDITS])
def test_the_cli_sets_what_the_page_sets(view, preset, changes, tmp_path, capsys):
    page = _page_bundle(view, preset, changes)
    sets = [arg for path, value in changes.items() for arg in ("--set", f"{path}={value}")]
    assert main(["export", preset, *sets, "-o", str(tmp_path)]) == 0
    said = capsys.readouterr().err
    assert "Set for you:" in said  # on stderr, as the page's notice says it
    written = {p.relative_to(tmp_path).as_posix(): p.read_text() for p in tmp_path.rglob("*") if p.is_file()}
    assert written == page  # the recipe package's files too (tunedeck_recipe/...)

    assert main(["export", preset, *sets, "--no-implied", "-o", str(tmp_path / "as-given")]) in (0, 2)
    assert "Set for you:" not in capsys.readouterr().err


def test_export_fsdp_full_fine_tune_uses_fsdp_checkpointing_and_says_so(tmp_path, capsys):
    assert main(["export", "7b-full-zero2", "--set", "strategy.kind=fsdp", "-o", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "strategy.fsdp_activation_checkpointing → true" in err and "training.gradient_checkpointing → false" in err
    assert "fsdp_activation_checkpointing: true" in (tmp_path / "accelerate_config.yaml").read_text()
    assert "activation_checkpointing: false" in (tmp_path / "training_args.yaml").read_text()
    assert "warning" not in err  # nothing left to warn about
