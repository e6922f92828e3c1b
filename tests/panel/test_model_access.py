"""The note under the form on where the model comes from, and the job events that redraw it."""

from __future__ import annotations

import gradio as gr
import pytest

from tunedeck.app.downloads import BundleWriter
from tunedeck.app.form import build_form
from tunedeck.app.job_events import JobShown
from tunedeck.app.job_view import JobView
from tunedeck.app.model_access import HUB, LOCAL, ModelAccessNote, access_markdown, model_source
from tunedeck.app.registry import Registry
from tunedeck.backend.render import render_bundle
from tunedeck.backend.spec import set_paths
from tunedeck.backend.spec.fields import FORM_FIELDS, values_from_spec
from tunedeck.tests.panel.test_job_view import got


@pytest.fixture
def no_token(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_TOKEN_PATH", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no saved token there


def test_a_local_folder_needs_no_login_and_a_hub_id_says_whether_this_machine_has_one(tmp_path, no_token, monkeypatch):
    assert model_source(str(tmp_path)) == LOCAL
    assert model_source("Qwen/Qwen2.5-7B-Instruct") == model_source("") == model_source(None) == HUB
    assert model_source(str(tmp_path / "missing")) == HUB  # not a folder here: from_pretrained asks the hub

    local = access_markdown(LOCAL)
    assert "local folder" in local and "no hub login needed" in local and "Gated" not in local
    assert "Not logged in here (no HF_TOKEN, no saved token)." in access_markdown(HUB)
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    hub = access_markdown(HUB)
    assert "Logged in here: HF_TOKEN is set." in hub and "hf_secret_value" not in hub


def test_the_note_follows_the_model_box_and_is_sent_only_when_its_kind_changes(tmp_path, demo_spec, no_token):
    demo = demo_spec()  # its model is a local folder (the built demo model)
    with gr.Blocks():
        ui = Registry()
        values = values_from_spec(demo).values()
        form = build_form({f.path: f.to_form(v) for f, v in zip(FORM_FIELDS, values)}, ui)
        note = ModelAccessNote(ui, demo.model.name_or_path)
        job = JobView(ui, form, list(render_bundle(demo)), BundleWriter(tmp_path))
        job.build_status()
        job.build_files()
        job.derived.append(note)
    assert "no hub login needed" in note.note.value

    def edit(spec, shown: JobShown, source: str) -> dict:
        return job.on_edit({**got(job, spec, shown, 0), note.shown: source})

    first = edit(demo, JobShown(), LOCAL)
    assert note.note not in first  # the note shown is the local one already
    hub = set_paths(demo, {"model.name_or_path": "meta-llama/Llama-3.1-8B-Instruct"})
    out = edit(hub, first[job.shown], LOCAL)
    assert out[note.shown] == HUB and "**Gated models**" in out[note.note] and "Not logged in here" in out[note.note]
    assert note.note not in edit(set_paths(hub, {"training.max_steps": 7}), out[job.shown], HUB)
    back = edit(demo, out[job.shown], HUB)
    assert back[note.shown] == LOCAL and "no hub login needed" in back[note.note]
