"""Loading a checkpoint into the user's server before it is scored (the sweep's and watcher's ``--reload``)."""

from __future__ import annotations

import os
import shlex
import subprocess

from ..errors import ServedError
from .client import ServerClient


def reload_into(command: str, checkpoint: str | None, step: int, *, timeout: float = 1800.0) -> None:
    """Run ``command`` with ``{checkpoint}``/``{step}`` filled in (also ``$TINYMCF_CHECKPOINT``, ``$TINYMCF_STEP``).

    It must exit 0 once the server serves that checkpoint; any other status, or running past
    ``timeout`` seconds, is an error naming the command's last output line.
    """
    where = "" if checkpoint is None else str(checkpoint)
    filled = command.replace("{checkpoint}", shlex.quote(where)).replace("{step}", str(int(step)))
    env = {**os.environ, "TINYMCF_CHECKPOINT": where, "TINYMCF_STEP": str(int(step))}
    try:
        done = subprocess.run(filled, shell=True, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ServedError(f"--reload did not finish within {timeout:g} s for step {step}: {filled}") from None
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1][:300]
        raise ServedError(f"--reload exited {done.returncode} for step {step} ({last}): {filled}")


def served_name(endpoint: str) -> str:
    """The one model the server lists; an error naming them when it lists several (pass --served-model)."""
    client = ServerClient(endpoint)
    try:
        listed = client.get("/v1/models") or {}
    finally:
        client.close()
    names = [m.get("id") for m in listed.get("data", []) if isinstance(m, dict)]
    if len(names) != 1:
        raise ServedError(f"the server at {client.shown} lists {len(names)} models ({', '.join(map(repr, names))}): "
                          "name the one to score with --served-model")
    return names[0]
