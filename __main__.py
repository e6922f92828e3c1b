"""The `tunedeck` command (and `python -m tunedeck`): the CLI's commands plus the panel's `ui`.

The CLI (backend/cli*.py) and the panel (app/) are two front ends over the same backend and
neither imports the other (tests/test_layers.py); this module is the one place that knows both.
"""

from __future__ import annotations

from tunedeck.backend import cli

# The panel first, then the CLI's own commands: the order of `tunedeck --help`.
COMMAND_MODULES = ["tunedeck.app.cli_ui", *cli.COMMAND_MODULES]


def main(argv: list[str] | None = None) -> int:
    return cli.main(argv, COMMAND_MODULES)


if __name__ == "__main__":
    raise SystemExit(main())
