"""The job's data before training: uploaded files kept where runs read them, what a file is (sniff), the rows as
the model will see them (preview), what max_seq_length cuts (truncation), and the built-in demo.

The face: the panel and the CLI import these names from `tunedeck.backend.data`, never its modules. No
`datasets` or torch at import: the panel reads files itself and builds the demo in a subprocess.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from tunedeck.backend.data.preview import PreviewError, for_job, measured_seq_len
from tunedeck.backend.data.preview import preview as preview_rows
from tunedeck.backend.data.truncation import (
    measure_key,
    measured_facts,
    measured_lengths,
    measured_locally,
    truncation_problems,
    why_not_measured,
)
from tunedeck.backend.data.uploads import SUFFIXES, UploadError, dataset_changes, held_out_offer, keep_upload

if TYPE_CHECKING:  # the lazy names' types, for the type checker
    from tunedeck.backend.data.demo import ensure_demo, ensure_demo_if_used, is_built

# demo.py runs as `python -m tunedeck.backend.data.demo` (it imports torch to build the tiny model): imported here
# eagerly, runpy would find it loaded already and run a second copy ("found in sys.modules ... unpredictable
# behaviour"). Its names come on first use instead (PEP 562).
_LAZY = {
    "ensure_demo": "tunedeck.backend.data.demo",
    "ensure_demo_if_used": "tunedeck.backend.data.demo",
    "is_built": "tunedeck.backend.data.demo",
}


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)


__all__ = [
    "SUFFIXES",
    "PreviewError",
    "UploadError",
    "dataset_changes",
    "ensure_demo",
    "ensure_demo_if_used",
    "for_job",
    "held_out_offer",
    "is_built",
    "keep_upload",
    "measure_key",
    "measured_facts",
    "measured_lengths",
    "measured_locally",
    "measured_seq_len",
    "preview_rows",
    "truncation_problems",
    "why_not_measured",
]
