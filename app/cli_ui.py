"""`tunedeck ui`: serve the control panel."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ui", help="open the control panel in the browser (Gradio)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; others need --auth)")
    p.add_argument("--port", type=int, default=7860, help="port (default 7860)")
    p.add_argument("--runs-dir", default="runs", metavar="DIR", help="folder of run folders (default ./runs)")
    who = p.add_mutually_exclusive_group()
    who.add_argument("--auth", metavar="USER:PASS", help="require this user and password")
    who.add_argument("--auth-file", metavar="FILE", help="require a login from this file of USER:PASS lines")
    p.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name a reverse proxy reaches the panel by (repeatable); requests for other names are refused",
    )
    p.add_argument(
        "--trusted-proxy",
        action="append",
        default=[],
        metavar="ADDR",
        help="a reverse proxy whose X-Forwarded-For names the client (repeatable; default: believed from none)",
    )
    p.add_argument(
        "--preset",
        metavar="ID",
        help="open the page on this preset (e.g. demo; see `tunedeck presets`; default: the demo on a machine without "
        "an NVIDIA GPU, else the first preset that runs on the GPUs found)",
    )
    p.set_defaults(handler=cmd_ui)


def cmd_ui(args: argparse.Namespace) -> int:
    from tunedeck.app.serving import ServingError, check_exposure, parse_credentials

    try:  # refuse before the slow part (importing Gradio, building the demo)
        credentials = parse_credentials(args.auth, args.auth_file)
        check_exposure(args.host, credentials)
    except ServingError as exc:
        print(f"tunedeck ui: {exc}", file=sys.stderr)
        return 2

    from tunedeck.backend.runs import RunError, RunManager

    try:  # the panel lists and starts runs there: a file, or a folder that cannot be made, is refused now
        RunManager(args.runs_dir).check_folder(create=True)
    except RunError as exc:
        print(f"tunedeck ui: {exc}", file=sys.stderr)
        return 2

    from tunedeck.backend.spec import load_presets

    if args.preset and args.preset not in load_presets():
        print(f"tunedeck ui: unknown preset {args.preset!r}; see `tunedeck presets`", file=sys.stderr)
        return 2
    # The Demo (CPU) button is always on the page, and its estimate reads the built model's config.
    from tunedeck.backend.data import ensure_demo

    print("tunedeck ui: making sure the demo model and dataset are built (once, about a minute)...", flush=True)
    print(f"tunedeck ui: demo assets in {ensure_demo()}", flush=True)

    # The panel's own temporary folder, removed on exit: Gradio's cache (every download the page
    # offers, every upload) and the bundles the page writes. Gradio's default cache is one folder
    # for the whole machine (/tmp/gradio) that outlives every panel, and its file route serves
    # anything in it to a signed-in client, also what other panels put there. Set before Gradio
    # is imported: gradio/route_utils.py reads GRADIO_TEMP_DIR at import.
    work = Path(tempfile.mkdtemp(prefix="tunedeck-panel-"))
    os.environ["GRADIO_TEMP_DIR"] = str(work / "gradio")
    os.environ["GRADIO_EXAMPLES_CACHE"] = str(work / "examples")  # also served; default: ./.gradio/cached_examples
    print(f"tunedeck ui: temporary files in {work} (removed when the panel stops)", flush=True)
    # SIGTERM (a service manager, `kill`) closes the panel as Ctrl-C does, so the cleanup below runs.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return _serve(args, credentials, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _serve(args: argparse.Namespace, credentials, work: Path) -> int:
    from tunedeck.app.page import build_page
    from tunedeck.app.serving import launch

    page = build_page(Path(args.runs_dir).resolve(), preset_id=args.preset or _first_preset(), work_dir=work)
    try:
        launch(
            page,
            args.host,
            args.port,
            credentials,
            allowed_hosts=args.allowed_host,
            trusted_proxies=args.trusted_proxy,
        )
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM, also while Gradio is still starting (its server answers first)
        # As Blocks.close(): its stop event first, which ends the open streams (Gradio's heartbeat, the Run tab's
        # bar), then the server. Gradio's block_thread() closes the server alone, which waits 5 s for them.
        page.close(verbose=False)
    except OSError as exc:  # the port is taken, or the address is not this machine's
        reason = str(exc).split(". You can")[0].rstrip(".")
        print(
            f"tunedeck ui: cannot serve on {args.host}:{args.port}: {reason}. Choose another --port.", file=sys.stderr
        )
        return 2
    return 0


def _first_preset() -> str:
    """The preset the page opens on without --preset (app/first_screen.py), said on the console."""
    from tunedeck.app.first_screen import Here, first_preset
    from tunedeck.app.job_tab import ordered_presets
    from tunedeck.backend.machine import shared_monitor

    here = Here.of(shared_monitor())
    preset = first_preset(ordered_presets(), here)
    found = f"{here.gpu_words} here" if here.gpus else "no NVIDIA GPU here"
    print(f"tunedeck ui: opening on the {preset.title} preset ({found}; --preset ID opens another)", flush=True)
    return preset.id
