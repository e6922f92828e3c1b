"""tunedeck: a control panel for distributed LLM fine-tuning.

This file makes the repository root the `tunedeck` package (see pyproject.toml): the code
lives in app/ (the Gradio page) and backend/ (everything else), imported as tunedeck.app and
tunedeck.backend.
"""

__version__ = "0.1.0"
