"""The Export part of the Try · Evaluate · Export tab: its layout and events over AfterView.merge and push, and
app/export_view.py's GGUF export.

A merge streams its progress into its status line and shows the serve.sh it wrote; a GGUF export streams a bar of its
steps, then lists its files (size, type, template, stop tokens) and shows the Modelfile, and Create in Ollama while an
Ollama server answers at the address given; either then replays held-out prompts through what it wrote (the export
check, unless unticked) and says how many answers stayed the same; a push names the merged
folder and the Hub repo, and a Hub error (which may quote the repo id) is shown as text.
"""

from __future__ import annotations

from collections.abc import Iterator

import gradio as gr

from tunedeck.app.after_events import streamed
from tunedeck.app.after_view import AfterView
from tunedeck.app.export_view import create_in_ollama, export_gguf, merge, ollama_offer, push
from tunedeck.app.registry import Got, Updates, listen
from tunedeck.app.untrusted_text import as_text
from tunedeck.backend.after import EXPORT_CHECK_PROMPTS, default_host
from tunedeck.backend.runs import AfterError

DTYPES = ["bfloat16", "float16", "float32"]
MERGE_IN = ("after.run", "after.merge_weights", "after.merge_name", "after.merge_dtype", "after.export_check")
GGUF_IN = ("after.run", "after.merge_weights", "after.merge_name", "after.gguf_quants", "after.export_check")
GGUF_QUANTS = ["f16", "q8_0", "q4_k_m"]
OLLAMA_OUT = ("after.ollama_status", "after.ollama_create")


def build_export(add) -> None:
    gr.Markdown(
        "### Export\nMerges the adapter into the base and saves a standalone model under the run folder "
        "(`<run>/merged/<name>/`), with `serve.sh` for vLLM. A QLoRA adapter is merged into the base loaded "
        "in 16 bit (or the dtype you pick), never into its 4-bit weights, so the merged model needs no bitsandbytes.",
        elem_id="after-export-title",
    )
    with gr.Row():
        add("after.merge_weights", gr.Dropdown(label="Adapter", choices=[], elem_id="after-merge-weights"))
        add("after.merge_dtype", gr.Dropdown(DTYPES, value="bfloat16", label="dtype", elem_id="after-merge-dtype"))
        add(
            "after.merge_name",
            gr.Textbox("model", label="folder name (under <run>/merged/ and <run>/gguf/)", elem_id="after-merge-name"),
        )
        add("after.merge", gr.Button("Merge", variant="primary", elem_id="after-merge"))
    add(
        "after.export_check",
        gr.Checkbox(
            True,
            label=f"then replay {EXPORT_CHECK_PROMPTS} held-out prompts (greedy) through what was written, as it will "
            "be served, and compare its answers with the adapter's",
            elem_id="after-export-check",
        ),
    )  # for Merge and Export GGUF alike
    add("after.merge_status", gr.Markdown(elem_id="after-merge-status"))
    add(
        "after.serve",
        gr.Code(label="serve.sh", language="shell", interactive=False, visible=False, elem_id="after-serve"),
    )  # shown once a merge wrote serve.sh
    gr.Markdown(
        "GGUF for llama.cpp, Ollama and LM Studio: the adapter merged, converted and quantized by llama.cpp's own "
        "tools into `<run>/gguf/<name>/`, with the run's chat template and stop tokens in each file and a "
        "`Modelfile` in the run's prompt format.",
        elem_id="after-gguf-title",
    )
    with gr.Row():
        add(
            "after.gguf_quants",
            gr.CheckboxGroup(GGUF_QUANTS, value=["q4_k_m"], label="GGUF types", elem_id="after-gguf-quants"),
        )
        add("after.export_gguf", gr.Button("Export GGUF", elem_id="after-export-gguf"))
    add("after.gguf_status", gr.Markdown(elem_id="after-gguf-status"))
    add(
        "after.modelfile",
        gr.Code(label="Modelfile (Ollama)", interactive=False, visible=False, elem_id="after-modelfile"),
    )  # shown once an export wrote it
    with gr.Row():
        add(
            "after.ollama_host",
            gr.Textbox(
                default_host(), label="Ollama server (asked once an export is written)", elem_id="after-ollama-host"
            ),
        )
        add(
            "after.ollama_create", gr.Button("Create in Ollama", visible=False, elem_id="after-ollama-create")
        )  # shown while a server answers there
    add("after.ollama_status", gr.Markdown(elem_id="after-ollama-status"))
    with gr.Row():
        add("after.repo_id", gr.Textbox(label="Hub repo id (user/name)", elem_id="after-repo-id"))
        add("after.token", gr.Textbox(label="Hub token (write access)", type="password", elem_id="after-token"))
        add("after.push", gr.Button("Push to the Hub", elem_id="after-push"))


def wire_export(ui, view: AfterView) -> None:
    run = ui["after.run"]

    @streamed
    def on_merge(got: Got) -> Iterator[Updates]:
        args = [got[ui[i]] for i in MERGE_IN]
        if not args[1]:
            raise AfterError("adapter: the run has saved no adapter yet")
        for updates in merge(view, args[0], args[1], (args[2] or "").strip(), args[3], bool(args[4])):
            if "after.serve" in updates:
                text = updates.pop("after.serve")
                updates["after.serve"] = gr.update(value=text, visible=bool(text))
            yield {ui[k]: v for k, v in updates.items()}

    gr.on(
        [ui["after.merge"].click],
        on_merge,
        inputs={ui[i] for i in MERGE_IN},
        outputs=[ui["after.merge_status"], ui["after.serve"]],
        show_progress="minimal",
        show_progress_on=[ui["after.merge"]],
    )

    @streamed
    def on_export_gguf(got: Got) -> Iterator[Updates]:
        run_id, weights, name, quants, check = (got[ui[i]] for i in GGUF_IN)
        if not weights:
            raise AfterError("adapter: the run has saved no adapter yet")
        for updates in export_gguf(view, run_id, weights, (name or "").strip(), quants, bool(check)):
            if "after.modelfile" in updates:
                updates["after.modelfile"] = gr.update(value=updates["after.modelfile"], visible=True)
                updates.update(offered(run_id, name, got[ui["after.ollama_host"]]))
            yield {ui[k]: v for k, v in updates.items()}

    gr.on(
        [ui["after.export_gguf"].click],
        on_export_gguf,
        inputs={ui[i] for i in (*GGUF_IN, "after.ollama_host")},
        outputs=[ui[i] for i in ("after.gguf_status", "after.modelfile", *OLLAMA_OUT)],
        show_progress="minimal",
        show_progress_on=[ui["after.export_gguf"]],
    )

    def offered(run_id: str, name: str | None, host: str | None) -> dict:
        """Create in Ollama shown while a server answers at the address, for the export named in the folder box."""
        offer = ollama_offer(view, run_id, (name or "").strip(), host or "")
        return {
            "after.ollama_status": offer["after.ollama_status"],
            "after.ollama_create": gr.update(visible=offer["ready"]),
        }

    def on_ollama_host(got: Got) -> Updates:
        return {
            ui[k]: v for k, v in offered(got[run], got[ui["after.merge_name"]], got[ui["after.ollama_host"]]).items()
        }

    ollama_in = [run, ui["after.merge_name"], ui["after.ollama_host"]]
    listen(
        [ui["after.ollama_host"].submit, ui["after.ollama_host"].blur],
        on_ollama_host,
        ollama_in,
        [ui[i] for i in OLLAMA_OUT],
    )

    @streamed
    def on_create_in_ollama(got: Got) -> Iterator[Updates]:
        name, host = (got[ui[i]] or "" for i in ("after.merge_name", "after.ollama_host"))
        for updates in create_in_ollama(view, got[run], name.strip(), host):
            yield {ui[k]: v for k, v in updates.items()}

    gr.on(
        [ui["after.ollama_create"].click],
        on_create_in_ollama,
        inputs=set(ollama_in),
        outputs=[ui["after.ollama_status"]],
        show_progress="minimal",
        show_progress_on=[ui["after.ollama_create"]],
    )

    def on_push(got: Got) -> Updates:
        name, repo, token = (got[ui[i]] or "" for i in ("after.merge_name", "after.repo_id", "after.token"))
        try:
            done = push(view, got[run], name.strip(), repo, token)
        except AfterError as exc:
            return {ui["after.merge_status"]: f"✗ {as_text(exc)}"}  # a Hub error quotes the repo id
        return {ui[k]: v for k, v in done.items()}

    push_in = [run, *(ui[i] for i in ("after.merge_name", "after.repo_id", "after.token"))]
    listen([ui["after.push"].click], on_push, push_in, [ui["after.merge_status"]], show_progress="minimal")
