"""The ``rollmux`` command, assembled at the top of the import graph.

``rollmux simulate`` (pure replay, :mod:`rollmux.cli`) plus the cluster operation commands
``up``, ``down``, ``submit``, ``status``, ``urls`` (:mod:`actors.ops.cli_ops`), which start the HTTP
admission app through :func:`serve_app.deploy`. Nothing imports this module, so neither
``rollmux/`` nor ``actors/`` depends on the HTTP app or on the other's commands.
"""

from __future__ import annotations

import typer

from actors.ops import cli_ops
from rollmux import cli as sim_cli
from rollmux.config import ServeConfig


def _deploy(cfg: ServeConfig, token: str) -> str:
    """Start the HTTP admission app (imports Ray Serve only when ``rollmux up`` runs)."""
    from serve_app import deploy

    return deploy(cfg, token)


def build_app() -> typer.Typer:
    """A fresh ``rollmux`` typer app: every command of :mod:`rollmux.cli` plus the operations."""
    app = typer.Typer(add_completion=False, no_args_is_help=True, help=sim_cli.app.info.help)
    app.callback()(sim_cli._commands)
    for cmd in sim_cli.app.registered_commands:
        app.registered_commands.append(cmd)
    cli_ops.register(app, _deploy)
    return app


app = build_app()

if __name__ == "__main__":  # pragma: no cover
    app()
