"""The panel stays light: importing it never loads the training stack."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ["torch", "transformers", "trl", "peft", "deepspeed", "bitsandbytes", "accelerate", "datasets"]


def test_panel_modules_import_no_training_stack():
    code = (
        "import sys, json, pkgutil, importlib, tunedeck.app\n"
        "for m in pkgutil.iter_modules(tunedeck.app.__path__): importlib.import_module('tunedeck.app.' + m.name)\n"
        "import tunedeck.backend.machine.monitor, tunedeck.backend.spec.fields\n"
        "from tunedeck.app.page import build_page\n"
        "build_page(__import__('pathlib').Path(sys.argv[1]), 'demo')\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    import tempfile

    with tempfile.TemporaryDirectory() as runs:
        proc = subprocess.run([sys.executable, "-c", code, runs], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
