"""The `flashd` command line: one click group; each command lives with the code it drives."""
from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="flashd")
def main() -> None:
    """flashd: a local LLM inference daemon built for speed on one GPU."""


def _register() -> None:
    from ..daemon.server import serve_command

    main.add_command(serve_command, "serve")


_register()
