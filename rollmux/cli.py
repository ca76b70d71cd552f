"""The ``rollmux`` command line (typer).

``rollmux simulate`` replays a trace through the policies (pure, no Ray). The cluster
operation commands (``up``, ``down``, ``submit``, ``status``, ``urls``) live with the Ray
mechanism in :mod:`actors.cli_ops` and are registered onto this app; they import Ray only
when run.
"""

from __future__ import annotations

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="RollMux: co-execution scheduler for disaggregated RL post-training.")


def _register_ops() -> None:
    try:
        from actors.cli_ops import register
    except ImportError:  # the actors package is not importable (policy-only install)
        return
    register(app)


_register_ops()

if __name__ == "__main__":  # pragma: no cover
    app()
