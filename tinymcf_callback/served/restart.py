"""A ``--reload`` command for a server that cannot load new weights in place, or not exactly: restart it on each
checkpoint.

    tinymcf watch runs/grpo --endpoint http://127.0.0.1:8000 --served-model policy \\
        --reload "python -m tinymcf_callback.served.restart --port 8000 --name policy -- \\
                  vllm serve {checkpoint} --port 8000 --served-model-name policy --dtype float32"

It exits 0 once the server it started, still running, lists ``--name`` from the checkpoint's folder; 1, with one
line saying why, otherwise. Standard library only; what it does step by step: docs/served.md ("Following a run
through a server").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
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
    stop_group(group)
    state.unlink(missing_ok=True)


def stop_group(group: int) -> None:
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
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)


def taken(port: int) -> bool:
    """Whether something already listens on 127.0.0.1:``port``."""
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def listed(port: int, name: str) -> dict | None:
    """The row of ``name`` in the server's ``GET /v1/models``, or None while it does not list it."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as answer:
            rows = json.load(answer).get("data", [])
    except (OSError, ValueError, AttributeError):
        return None
    return next((m for m in rows if isinstance(m, dict) and m.get("id") == name), None)


def same_folder(root, checkpoint: str) -> bool:
    """Whether the model's ``root`` the server lists is the checkpoint's folder (where it says a folder at all)."""
    if not checkpoint or not isinstance(root, str) or not os.path.exists(root):
        return True  # a Hub id, a name: nothing to compare
    return os.path.realpath(root) == os.path.realpath(checkpoint)


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (an exited one its parent has not reaped yet does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def guard(follower: int, group: int) -> None:
    """Wait for the follower (``follower``, a process id) to end, then stop the server's process ``group``."""
    while alive(follower) and alive(group):
        time.sleep(1)
    stop_group(group)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tinymcf_callback.served.restart",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True, help="the port the server listens on")
    parser.add_argument("--name", help="the model name the server lists once it serves (required to start one)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for it (default 900)")
    parser.add_argument("--state", default=None, help="where the running server's process group id is kept")
    parser.add_argument("--stop", action="store_true", help="stop the server this script started, and exit")
    parser.add_argument("--guard", nargs=2, type=int, metavar=("FOLLOWER", "GROUP"), help=argparse.SUPPRESS)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the server's command")
    args = parser.parse_args(argv)
    if args.guard:
        guard(*args.guard)
        return 0
    state = Path(args.state or Path(tempfile.gettempdir()) / f"tinymcf-reload-{args.port}.pid")
    stop(state)
    if args.stop:
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or not args.name:
        parser.error("give --name and the server's command after --")
    if taken(args.port):
        print(f"port {args.port} is taken by a process this script did not start: stop it, or start the server on "
              "a free port (it would answer for the checkpoint instead)", file=sys.stderr)
        return 1
    log = state.with_suffix(".log")
    with open(log, "w") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    state.write_text(str(server.pid))  # its own session: the process group id is its pid
    follower = os.environ.get("TINYMCF_PID")
    if follower:  # the server goes when the follower does
        itself = ["-m", __spec__.name] if __spec__ is not None else [__file__]  # as it was started
        subprocess.Popen([sys.executable, *itself, "--port", str(args.port), "--guard", follower, str(server.pid)],
                         start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    checkpoint = os.environ.get("TINYMCF_CHECKPOINT", "")
    deadline = time.monotonic() + args.timeout
    why = None
    while time.monotonic() < deadline:
        if server.poll() is not None:
            break
        row = listed(args.port, args.name)
        if row is not None and server.poll() is None:  # listed, and by a server that is still ours
            if same_folder(row.get("root"), checkpoint):
                return 0
            why = f"it lists {args.name!r} from {row.get('root')}, not {checkpoint}"
            break
        time.sleep(0.5)
    last = (log.read_text(errors="replace").strip().splitlines() or ["no output"])[-1][:300]
    print(f"the server did not come up serving {args.name!r} on port {args.port}: {why or last}", file=sys.stderr)
    stop(state)
    return 1


if __name__ == "__main__":
    sys.exit(main())
