"""One free-port helper for every test that starts processes that talk (torchrun's rendezvous, a local server)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the kernel's choice, so parallel tests do not collide)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nproc: int = 2) -> list[str]:
    """``python -m torch.distributed.run`` with ``nproc`` processes on a free rendezvous port."""
    import sys

    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
            str(free_port())]
