"""Finding out what a server is, and checking it before any prompt is scored; each check returns what it found.

:func:`discover` (the server's kind, version and models, and that it serves the model asked for), :func:`check_template`
(its tokenization and chat template must be the local tokenizer's: another is refused, naming the first token or
character that differs) and :func:`check_logprobs` (whether the log-probabilities a form reads are the model's own).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ServedError
from ..scoring.prompts import render_turn
from .client import ServerClient
from .forms import Reading

KINDS = ("vllm", "sglang", "llama.cpp", "openai-compatible")
# log-probability change between temperature 1 and 0.5 that reveals processing: temperature 0.5 doubles every logit
# gap, which moves an answer token's log-probability by tenths (random tiny models: ~0.1; SmolLM2: ~1), far above a
# server's repeat noise, which it must also be 10 times above
PROCESSED_TOLERANCE = 0.02


@dataclass
class Server:
    """What answered: ``kind`` (:data:`KINDS`), its version, the models it lists; ``adapters`` maps each LoRA adapter
    it lists to its base model (vLLM's ``parent``), ``model`` the name asked for."""

    kind: str
    version: str | None = None
    models: list[str] = field(default_factory=list)
    adapters: dict[str, str] = field(default_factory=dict)
    model: str | None = None
    roots: dict[str, str] = field(default_factory=dict)  # each listed model's root (an adapter's: its folder)
    device: str | None = None  # where it computes (cpu, cuda, ...), where the server says (vLLM in dev mode, SGLang)
    dtype: str | None = None  # the precision it computes in (float32, bfloat16, ...), where the server says

    @property
    def lora(self) -> bool:
        """The server has LoRA adapters loaded (vLLM started with ``--enable-lora``)."""
        return bool(self.adapters)


def discover(client: ServerClient, model: str) -> Server:
    """Which server this is, asked afresh (a reload may have changed it), and that it serves ``model``."""
    listed = client.get("/v1/models", quiet=True)  # a server that is down raises here, in one line
    rows = [m for m in (listed or {}).get("data", []) if isinstance(m, dict)]
    models = [m.get("id") for m in rows]
    adapters = {m["id"]: m["parent"] for m in rows if isinstance(m.get("parent"), str) and m.get("parent") != m["id"]}
    roots = {m["id"]: m["root"] for m in rows if isinstance(m.get("root"), str)}
    props = client.get("/props", quiet=True)
    if isinstance(props, dict) and ("default_generation_settings" in props or "build_info" in props):
        server = Server("llama.cpp", str(props.get("build_info") or "") or None, models)
    else:
        info = server_info(client)
        version = client.get("/version", quiet=True)
        if isinstance(info, dict) and ("tp_size" in info or "disable_radix_cache" in info):
            server = Server("sglang", (version or {}).get("version") if isinstance(version, dict) else None, models)
        elif isinstance(version, dict) and "version" in version:
            server = Server("vllm", str(version["version"]), models, adapters)
        else:
            refuse_python_llama_cpp(client)
            server = Server("openai-compatible", None, models)
        setup = setup_of(info)
        server.device, server.dtype = setup.get("device"), setup.get("dtype")
    server.model, server.roots = model, roots
    if server.kind != "llama.cpp" and models and model not in models:
        raise ServedError(f"the server at {client.shown} serves {', '.join(map(repr, models))}, not {model!r}: "
                          f"pass one of those with --model")
    if listed is None and server.kind == "openai-compatible":
        raise ServedError(f"the server at {client.shown} answers but has no /v1/models: not an OpenAI-compatible "
                          "server, or --endpoint is not its root (give http://host:port)")
    return server


def server_info(client: ServerClient):
    """What the server says of its setup: SGLang's ``/get_server_info``, else vLLM's ``/server_info`` (dev mode, its
    configuration as JSON), else None."""
    return client.get("/get_server_info", quiet=True) or client.get("/server_info?config_format=json", quiet=True)


def setup_of(info) -> dict[str, str]:
    """``{"device": ..., "dtype": ...}`` from a :func:`server_info` answer, as far as it says (``torch.float32`` and
    ``float32`` alike give ``float32``)."""
    if not isinstance(info, dict):
        return {}
    config = info.get("vllm_config")
    if isinstance(config, dict):  # vLLM: its VllmConfig as JSON
        device = (config.get("device_config") or {}).get("device")
        dtype = (config.get("model_config") or {}).get("dtype")
    else:  # SGLang: its ServerArgs
        device, dtype = info.get("device"), info.get("dtype")
    found = {"device": device, "dtype": dtype}
    return {k: str(v).removeprefix("torch.") for k, v in found.items() if isinstance(v, str) and v and v != "auto"}


def refuse_python_llama_cpp(client: ServerClient) -> None:
    """llama-cpp-python's own server (its FastAPI title says so) takes no token-id prompts and keys log-probabilities
    by detokenized text: refused in one line, with what to run instead."""
    schema = client.get("/openapi.json", quiet=True)
    title = str(((schema or {}).get("info") or {}).get("title", "")) if isinstance(schema, dict) else ""
    if "llama.cpp python" in title.lower() or "llama_cpp" in title.lower():
        raise ServedError(f"the server at {client.shown} is llama-cpp-python's Python server ({title!r}), which takes "
                          f"no token-id prompts: serve the GGUF with llama.cpp's own server instead (llama-server -m "
                          "MODEL.gguf --port 8080 --jinja), or the model's weights with vLLM or SGLang")


def token_ids_refused(e: ServedError) -> bool:
    """Whether a failed request says the server wants the prompt as text, not token ids (a validation error)."""
    text = str(e).lower()
    return "prompt" in text and any(w in text for w in ("valid string", "str type", "type=string", "must be a string",
                                                        "should be a valid", "validation error"))


def check_template(client: ServerClient, server: Server, tok, ids: list[int], text: str, turn: list[dict]) -> str:
    """The server's tokenizer and chat template against the local ones, on one prompt (``ids``, its ``text`` and
    its chat ``turn``); what was checked, or :class:`ServedError` for a mismatch."""
    if server.kind == "llama.cpp":
        got = client.post("/tokenize", {"content": text, "add_special": False, "parse_special": True}, quiet=True)
        rendered = client.post("/apply-template", {"messages": turn}, quiet=True)
        rendered = rendered.get("prompt") if isinstance(rendered, dict) else None
    else:
        got = client.post("/tokenize", {"model": server.model, "prompt": text, "add_special_tokens": False},
                          quiet=True)
        chat = client.post("/tokenize", {"model": server.model, "messages": turn, "add_generation_prompt": True,
                                         "add_special_tokens": False,
                                         "chat_template_kwargs": {"enable_thinking": False}}, quiet=True)
        rendered = tok.decode(chat["tokens"]) if isinstance(chat, dict) and "tokens" in chat else None
    server_ids = got.get("tokens") if isinstance(got, dict) else None
    if server_ids is None and rendered is None:
        return "not checked: the server has no /tokenize"
    if server_ids is not None:
        server_ids = [t["id"] if isinstance(t, dict) else int(t) for t in server_ids]
        if server_ids != list(ids):
            n = first_difference(list(ids), server_ids)
            ours = tok.decode(ids[n:n + 3]) if n < len(ids) else "(end)"
            theirs = repr(server_ids[n:n + 3]) if n < len(server_ids) else "(end)"
            raise ServedError(f"the server at {client.shown} tokenizes the prompts differently from the local "
                              f"tokenizer {getattr(tok, 'name_or_path', '')!r}: first difference at token {n} (local "
                              f"{list(ids[n:n + 3])} = {ours!r}, server {theirs}); load the served model's own "
                              "tokenizer with --tokenizer")
    if rendered is not None:
        local = render_turn(tok, turn)
        if rendered != local:
            n = first_difference(local, rendered)
            raise ServedError(f"the server at {client.shown} renders the chat turn with another template: they differ "
                              f"at character {n} (local {local[n:n + 30]!r}, server {rendered[n:n + 30]!r}); give "
                              "the server the model's own chat template (vLLM --chat-template, llama.cpp "
                              "--chat-template-file), or load its tokenizer with --tokenizer")
    return "checked: " + " and ".join(w for w, ok in (("tokenizer", server_ids is not None),
                                                      ("chat template", rendered is not None)) if ok)


def first_difference(a, b) -> int:
    """The first index where two sequences differ (the shorter one's length when one is the other's start)."""
    return next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def change(a: Reading, b: Reading) -> float:
    """The largest log-probability difference between two readings, on the answer tokens both read (infinite where
    one reads a token as impossible and the other does not)."""
    diffs = [0.0 if a.logp[t] == b.logp[t] else abs(a.logp[t] - b.logp[t]) for t in a.logp if t in b.logp]
    return max(diffs, default=0.0)


@dataclass
class LogprobsCheck:
    """What :func:`check_logprobs` found: ``mode`` is ``raw`` (the numbers do not move with the temperature) or
    ``processed`` (they do); ``moved`` how much they moved between temperature 1 and 0.5, ``noise`` between the two
    asks at temperature 1."""

    mode: str
    moved: float
    noise: float
    reading: Reading  # the first reading at the pinned settings
    pinned_diff: float | None = None  # processed: the pinned reading against the prompt's own log-probabilities


def check_logprobs(readings: tuple[Reading, Reading, Reading]) -> LogprobsCheck:
    """The same prompt read at temperature 1, 0.5 and 1 again (every other sampling setting pinned): numbers that
    move with the temperature (more than :data:`PROCESSED_TOLERANCE` and 10 times the repeat noise) come from a
    server that returns processed log-probabilities; a server that is merely not repeatable is the self-check's to
    find."""
    one, half, again = readings
    moved, noise = change(one, half), change(one, again)
    processed = moved > max(PROCESSED_TOLERANCE, 10 * noise)
    return LogprobsCheck("processed" if processed else "raw", moved, noise, one)
