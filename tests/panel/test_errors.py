"""Handler failures reach the page as messages, never as tracebacks."""

from __future__ import annotations

import gradio as gr
import pytest

from tunedeck.app.errors import shown_as_message
from tunedeck.backend.runs.manager import RunError
from tunedeck.backend.spec import SpecError
from tunedeck.backend.spec.problem import error


def test_known_errors_keep_their_message():
    @shown_as_message
    def refuse():
        raise RunError("GPU 0 is in use by run 20250101-120000-a1b2c3: stop it")

    with pytest.raises(gr.Error) as err:
        refuse()
    assert err.value.message == "GPU 0 is in use by run 20250101-120000-a1b2c3: stop it"

    @shown_as_message
    def bad_spec():
        raise SpecError([error("lora.r", "Input should be greater than or equal to 1")])

    with pytest.raises(gr.Error) as err:
        bad_spec()
    assert err.value.message == "LoRA rank (`lora.r`): Input should be greater than or equal to 1"  # its label


def test_unexpected_errors_name_the_type_without_a_traceback(caplog):
    @shown_as_message
    def broken():
        return {}["missing"]

    with pytest.raises(gr.Error) as err:
        broken()
    assert "KeyError" in err.value.message and "Traceback" not in err.value.message
    assert "Traceback" in caplog.text  # the operator still gets it, in the console
