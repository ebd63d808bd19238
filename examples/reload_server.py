"""A ``--reload`` command for a server that cannot load new weights in place: restart it on each checkpoint.

    tinymcf watch runs/grpo --endpoint http://127.0.0.1:8000 --served-model policy \\
        --reload "python examples/reload_server.py --port 8000 --name policy -- \\
                  vllm serve {checkpoint} --port 8000 --served-model-name policy --dtype float32"

``tinymcf`` fills in ``{checkpoint}`` and runs this before scoring each step (the step-0 baseline too). It stops the
server it started for the step before (its process group, whose id it keeps in ``--state``), starts the command
given after ``--`` in a process group of its own (its output in ``<state>.log``), and exits 0 once
``GET http://127.0.0.1:<port>/v1/models`` lists ``--name``; 1, with the server log's last line, when the server
exits first or does not answer within ``--timeout`` seconds. ``tinymcf`` then scores the step; a failed reload
leaves it unscored (never scored on the old weights). Servers that reload in place need no script:
``--reload vllm``, ``--reload sglang``, ``--reload lora`` (docs/rl.md).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def stop(state: Path) -> None:
    """Stop the server this script started last time (its whole process group), if it still runs."""
    try:
        group = int(state.read_text())
    except (OSError, ValueError):
        return
    try:
        os.killpg(group, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(100):  # up to 10 s to go, then it is killed
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.killpg(group, signal.SIGKILL)


def serving(port: int, name: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as answer:
            listed = json.load(answer)
    except (OSError, ValueError):
        return False
    return any(m.get("id") == name for m in listed.get("data", []) if isinstance(m, dict))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True, help="the port the server listens on")
    parser.add_argument("--name", required=True, help="the model name the server lists once it serves")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for it (default 900)")
    parser.add_argument("--state", default=None, help="where the running server's process group id is kept")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the server's command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the server's command after --")
    state = Path(args.state or Path(tempfile.gettempdir()) / f"tinymcf-reload-{args.port}.pid")
    stop(state)
    log = state.with_suffix(".log")
    with open(log, "w") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    state.write_text(str(server.pid))  # its own session: the process group id is its pid
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        if serving(args.port, args.name):
            return 0
        if server.poll() is not None:
            break
        time.sleep(0.5)
    last = (log.read_text(errors="replace").strip().splitlines() or ["no output"])[-1][:300]
    print(f"the server did not come up serving {args.name!r} on port {args.port}: {last}", file=sys.stderr)
    stop(state)
    return 1


if __name__ == "__main__":
    sys.exit(main())
