"""Loading a checkpoint into the server before it is scored (the sweep's and the watcher's ``--reload``).

``--reload`` is a built-in that drives the server's own weight-update API (:data:`RELOADS`: ``vllm``, ``sglang``,
``lora``), or a shell command of the user's, run with ``{checkpoint}`` and ``{step}`` filled in, that exits 0 once the
server serves that checkpoint. What a reload is trusted with (at most :data:`SENDS` sends per checkpoint, the scores
checked by :mod:`~tinymcf_callback.served.verify`, a model a backend cannot reload exactly refused first, naming
:data:`RESTART`): docs/served.md, "What a reload verifies".
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import CheckpointUnusable, ServedError
from ..registry import Registry
from .client import ServerClient
from .config import RELOAD_TIMEOUT_S
from .server import server_info, setup_of

POLL_S = 0.5  # between two questions to the server whether it serves the new weights yet
SENDS = 2  # times one checkpoint is sent to the server (a route asked, or the command run), over all its step's tries
RESTART = "python -m tinymcf_callback.served.restart"  # for a server that cannot reload in place, or not exactly


@dataclass(frozen=True)
class Route:
    """One built-in ``--reload``: a record of :data:`RELOADS` (see the module).

    Args:
        name: what ``--reload`` says.
        send: ``send(client, folder, version, model)``: the requests that load ``folder`` into the server, each asked
            once (the :class:`Reloader` counts what was sent).
        serving: ``serving(client, model)``: what the server serves now, polled until it is the new checkpoint.
        inexact: ``inexact(client, folder, model)``: why the route cannot give a server on the CPU the run's models
            exactly (``folder``: one of its checkpoints, else its starting model), or None.
        adapter: it loads a LoRA adapter in place under ``--served-model``: the server names what it serves by the
            adapter's folder (not a version), and the run's step 0 is the model the adapter sits on.
        summary: what it drives, as ``--reload``'s help says it.
    """

    name: str
    send: Callable[[ServerClient, str, str, str | None], None]
    serving: Callable[[ServerClient, str | None], str | None]
    inexact: Callable[[ServerClient, str, str | None], str | None]
    adapter: bool = False
    summary: str = ""


RELOADS: Registry[Route] = Registry("--reload built-in")  # its records are at the end of the module


def reloads_adapter(command: str | None) -> bool:
    """Whether ``--reload command`` is a built-in that loads LoRA adapters in place (:attr:`Route.adapter`)."""
    return command in RELOADS and RELOADS[command].adapter


class Reloader:
    """How a followed run's checkpoints get into its server: a built-in (:data:`RELOADS`, at ``endpoint``, the served
    name ``model``) or the user's ``command``; it counts what it sent per checkpoint over the run."""

    def __init__(self, command: str, endpoint: str | None = None, model: str | None = None, *,
                 timeout: float = RELOAD_TIMEOUT_S):
        if command in RELOADS and endpoint is None:
            raise ServedError(f"--reload {command} needs --endpoint, the server to load each checkpoint into")
        self.command, self.endpoint, self.model, self.timeout = command, endpoint, model, timeout
        self.sent: Counter[tuple[str, str | None]] = Counter()

    @property
    def builtin(self) -> bool:
        return self.command in RELOADS

    @property
    def shown(self) -> str:
        return f"--reload {self.command}" if self.builtin else "--reload"

    def refuse_inexact(self, folder: str | None) -> None:
        """:class:`ServedError`, before anything is scored, when this route cannot give the server the run's models
        exactly (its :attr:`Route.inexact`; ``folder``: one of its checkpoints, else its starting model), on a server
        that says it runs on the CPU (see the module)."""
        if not self.builtin or folder is None:
            return
        client = ServerClient(self.endpoint, retries=2)
        try:
            why = RELOADS[self.command].inexact(client, folder, self.model)
            if why is None or setup_of(server_info(client)).get("device") != "cpu":
                return
        finally:
            client.close()
        raise ServedError(f"--reload {self.command} cannot give the vLLM at {client.shown} this run's models exactly: "
                          f"on the CPU, {why}; restart the server on each checkpoint instead: --reload \""
                          f"{RESTART} --port PORT --name NAME -- vllm serve {{checkpoint}} ...\" (docs/served.md, "
                          "'What a reload verifies')")

    def load(self, folder: str | None, step: int, version: str | None = None) -> str | None:
        """Load ``folder`` (step ``step``) into the server: the weight version it answers with now (a built-in's:
        ``version``, default ``step-<step>``; an adapter's: its folder), None for a command.

        Raises :class:`~tinymcf_callback.errors.CheckpointUnusable` (not to be tried again in this run) once the
        checkpoint was sent :data:`SENDS` times without taking; :class:`ServedError` for a failure that a later try may
        not meet. The follower reads the checkpoint's weight files before (a file cut short is never sent)."""
        where = "" if folder is None else str(folder)
        key = (where, version)
        if self.sent[key] >= SENDS:
            raise CheckpointUnusable(f"{self.shown} could not load step {step} ({where}) into the server: "
                                     f"{self._given_up()}")
        self.sent[key] += 1
        try:
            if not self.builtin:
                run_command(self.command, folder, step, timeout=self.timeout)
                return None
            return self._builtin(where, step, version or f"step-{step}")
        except ServedError as e:
            if self.sent[key] >= SENDS:
                raise CheckpointUnusable(f"{self._given_up()}: {e}") from None
            raise

    def _builtin(self, folder: str, step: int, version: str) -> str:
        """The built-in route's requests, then a poll until the server answers with the new weights: their version (an
        adapter's: its folder)."""
        route = RELOADS[self.command]
        expected = folder if route.adapter else version
        client = ServerClient(self.endpoint, timeout=self.timeout, retries=0)
        try:
            route.send(client, folder, version, self.model)
            deadline = time.monotonic() + self.timeout
            while (seen := route.serving(client, self.model)) != expected:
                if time.monotonic() > deadline:
                    raise ServedError(f"it still answers with weight version {seen!r}, not {expected!r}, after "
                                      f"{self.timeout:g} s")
                time.sleep(POLL_S)
            return expected
        except ServedError as e:
            raise ServedError(f"--reload {route.name} could not load step {step} ({folder}) into the server: {e}; "
                              "it is not scored on the old weights") from None
        finally:
            client.close()

    @staticmethod
    def _given_up() -> str:
        return f"sent {SENDS} times without taking, not sent again in this run (see the server's log; or {RESTART})"


def trains_output_layer(folder: str) -> bool:
    """Whether the PEFT adapter in ``folder`` trains the output layer (``lm_head`` among its target modules or the
    modules it saves whole); False for a folder without an adapter config."""
    try:
        config = json.loads((Path(folder) / "adapter_config.json").read_text())
    except (OSError, ValueError):
        return False
    names = []
    for key in ("target_modules", "modules_to_save"):
        value = config.get(key) or []
        names += [value] if isinstance(value, str) else list(value)
    return any("lm_head" in str(name) for name in names)


def ties_embeddings(folder: str) -> bool:
    """Whether the model saved in ``folder`` ties its output layer to its input embeddings (False when its config
    cannot be read: nothing to refuse on)."""
    if not (Path(folder) / "config.json").is_file():
        return False
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(folder)
    except (OSError, ValueError, KeyError):
        return False
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return bool(getattr(text, "tie_word_embeddings", getattr(config, "tie_word_embeddings", False)))


def run_command(command: str, checkpoint: str | None, step: int, *, timeout: float = RELOAD_TIMEOUT_S) -> None:
    """Run ``command`` with ``{checkpoint}``/``{step}`` filled in (also ``$TINYMCF_CHECKPOINT``, ``$TINYMCF_STEP``,
    ``$TINYMCF_PID``); another status than 0, or running past ``timeout`` seconds, is an error."""
    where = "" if checkpoint is None else str(checkpoint)
    filled = command.replace("{checkpoint}", shlex.quote(where)).replace("{step}", str(int(step)))
    env = {**os.environ, "TINYMCF_CHECKPOINT": where, "TINYMCF_STEP": str(int(step)), "TINYMCF_PID": str(os.getpid())}
    try:
        done = subprocess.run(filled, shell=True, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ServedError(f"--reload did not finish within {timeout:g} s for step {step}: {filled}") from None
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1][:300]
        raise ServedError(f"--reload exited {done.returncode} for step {step} ({last}): {filled}")


VERSION_ROUTES = {"vllm": "/weight_info", "sglang": "/get_weight_version"}  # a server's kind -> its weight version


def weight_version(client: ServerClient, kind: str) -> str | None:
    """The weight version a server of ``kind`` reports (:data:`VERSION_ROUTES`: vLLM in dev mode, SGLang), or None
    where it has none."""
    route = VERSION_ROUTES.get(kind)
    answer = client.get(route, quiet=True) if route else None
    version = answer.get("weight_version") if isinstance(answer, dict) else None
    return None if version is None else str(version)


def adapter_root(client: ServerClient, model: str | None, *, quiet: bool = False) -> str | None:
    """The folder the server loaded its adapter ``model`` from (``root`` in vLLM's ``/v1/models``), or None."""
    listed = client.get("/v1/models", quiet=quiet) or {}
    rows = [m for m in listed.get("data", []) if isinstance(m, dict) and m.get("id") == model]
    return rows[0].get("root") if rows else None


def base_name(endpoint: str, adapter: str) -> str:
    """The model the server's adapter ``adapter`` sits on (vLLM's ``parent`` in ``/v1/models``)."""
    client = ServerClient(endpoint)
    try:
        rows = [m for m in (client.get("/v1/models") or {}).get("data", []) if isinstance(m, dict)]
    finally:
        client.close()
    parent = next((m.get("parent") for m in rows if m.get("id") == adapter), None)
    if not isinstance(parent, str) or not parent:
        raise ServedError(f"the server at {client.shown} does not list {adapter!r} as an adapter on a base model "
                          "(--reload lora scores step 0 on the adapter's base): start it with --enable-lora and "
                          "--lora-modules NAME=PATH, NAME being --served-model")
    return parent


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


# ---- the built-in routes ---------------------------------------------------------------------------------------
_DEV_MODE = "start vLLM with VLLM_SERVER_DEV_MODE=1"


def _post(client: ServerClient, route: str, body: dict, needs: str):
    """POST once; a server without ``route`` is told what it ``needs``."""
    try:
        return client.post(route, body)
    except ServedError as e:
        if getattr(e, "status", None) in (404, 405):
            raise ServedError(f"the server has no {route}: {needs}") from None
        raise


def _send_vllm(client: ServerClient, folder: str, version: str, model: str | None) -> None:
    _post(client, "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": folder}},
          f"{_DEV_MODE} (its weight-reload routes)")
    _post(client, "/reset_prefix_cache", {}, _DEV_MODE)
    _post(client, "/update_weight_version", {"new_version": version}, _DEV_MODE)


def _send_sglang(client: ServerClient, folder: str, version: str, model: str | None) -> None:
    answer = _post(client, "/update_weights_from_disk", {"model_path": folder, "weight_version": version},
                   "an SGLang server with /update_weights_from_disk")
    if isinstance(answer, dict) and answer.get("success") is False:
        raise ServedError(f"it refused: {answer.get('message')}")


def _send_lora(client: ServerClient, folder: str, version: str, model: str | None) -> None:
    if not model:
        raise ServedError("name the adapter the server serves with --served-model")
    _post(client, "/v1/load_lora_adapter", {"lora_name": model, "lora_path": folder, "load_inplace": True},
          "start vLLM with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True")
    client.post("/reset_prefix_cache", {}, quiet=True)  # where the server has it (dev mode): stale prefixes go


def _vllm_inexact(client: ServerClient, folder: str, model: str | None) -> str | None:
    if not ties_embeddings(folder):
        return None
    return ("vLLM's reload_weights leaves an output layer tied to the input embeddings (tie_word_embeddings in "
            f"{Path(folder).name}'s config) with the weights the server started with, while /weight_info names the "
            "new checkpoint")


def _lora_inexact(client: ServerClient, folder: str, model: str | None) -> str | None:
    held = adapter_root(client, model, quiet=True)
    adapters = [f for f in (folder, held) if isinstance(f, str) and trains_output_layer(f)]
    if not adapters:
        return None
    return (f"while an adapter that trains the output layer (lm_head, as {Path(adapters[0]).name}'s does) is loaded, "
            "vLLM answers requests for the base model with other numbers (measured: 1.4e-2 apart in P(Yes)), so the "
            "run's step 0 would be scored wrong")


for _route in (
    Route("vllm", _send_vllm, lambda client, model: weight_version(client, "vllm"), _vllm_inexact,
          summary="a vLLM in VLLM_SERVER_DEV_MODE=1: weights reloaded in place"),
    Route("sglang", _send_sglang, lambda client, model: weight_version(client, "sglang"),
          lambda client, folder, model: None, summary="SGLang's /update_weights_from_disk"),
    Route("lora", _send_lora, adapter_root, _lora_inexact, adapter=True,
          summary="a vLLM with --enable-lora: the adapter loaded in place under --served-model"),
):
    RELOADS.register(_route.name, _route)
