"""Sending a probe's requests to one server: batched where the server takes a list of prompts, through a bounded
pool of requests in flight, in the order given (so a check's repeat of a prompt lands far from its first reading).
When a request fails for good, the requests not sent yet are dropped and the client's connections closed, so that
the server aborts the requests still in flight instead of computing answers nobody reads.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from .client import ServerClient
from .forms import Form, Reading


@dataclass
class Ask:
    """One request: ``form`` asked for ``prompts`` (one key each, naming the reading in the result) with ``options``
    (:meth:`Form.payload`'s ``temperature``, ``top``, ``only``, ``whole``)."""

    form: Form
    keys: list[Hashable]
    prompts: list[list[int]]
    options: dict = field(default_factory=dict)


def merge(out: dict, key: Hashable, reading: Reading) -> None:
    """``reading`` into ``out[key]``: a prompt asked in parts (one answer token per request) gathers them."""
    if key not in out:
        out[key] = reading
        return
    out[key].logp.update(reading.logp)
    out[key].top = out[key].top or reading.top


def one_token_each(form: Form, keyed: Iterable[tuple[Hashable, list[int]]], answers: list[int]) -> list[Ask]:
    """Echo asked one sequence per request (each prompt with one answer token): what a server that fails on several
    prompt log-probability sequences in one batch takes (a vLLM with LoRA adapters on the CPU)."""
    return [Ask(form, [k], [p], {"only": [a]}) for k, p in keyed for a in answers]


def batches(form: Form, keyed: Iterable[tuple[Hashable, list[int]]], size: int, **options) -> list[Ask]:
    """``keyed`` (key, prompt) pairs as requests of at most ``size`` prompts (1 where the form takes one at a time)."""
    keyed = list(keyed)
    size = size if form.batched else 1
    return [Ask(form, [k for k, _ in chunk], [p for _, p in chunk], dict(options))
            for chunk in (keyed[i:i + size] for i in range(0, len(keyed), max(1, size)))]


class Transport:
    """The requests of one probe to one server (see the module)."""

    def __init__(self, client: ServerClient, concurrency: int):
        self.client, self.concurrency = client, max(1, int(concurrency))
        self.sent = 0  # requests answered through this transport

    def ask(self, ask: Ask, *, retries: int | None = None) -> list[Reading]:
        """One request, sent now: its readings, in the order of its prompts (``retries``: the client's unless given)."""
        data = self.client.post(ask.form.route, ask.form.payload(ask.prompts, **ask.options), retries=retries)
        self.sent += 1
        read = {k: v for k, v in ask.options.items() if k != "temperature"}  # what shapes the answer, not its values
        return ask.form.parse(data, ask.prompts, shown=self.client.shown, **read)

    def run(self, asks: list[Ask], *, progress: bool = False, desc: str = "") -> dict[Hashable, Reading]:
        """Every ask through the pool; each prompt's reading by its key."""
        from tqdm.auto import tqdm

        out: dict[Hashable, Reading] = {}
        lock = threading.Lock()
        bar = tqdm(total=sum(len(a.keys) for a in asks), desc=desc, unit="prompt", disable=not progress,
                   dynamic_ncols=True, leave=False)

        stop = threading.Event()  # set by the first ask that fails: a worker takes its next ask before the pool is
        # shut down below, and under load that was one more request sent after a timeout (seen with 3 jobs on 2 cores)

        def work(ask: Ask) -> None:
            if stop.is_set():
                return
            try:
                readings = self.ask(ask)
            except BaseException:
                stop.set()
                raise
            with lock:
                for key, reading in zip(ask.keys, readings, strict=True):
                    merge(out, key, reading)
                bar.update(len(ask.keys))

        pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="tinymcf-served")
        try:
            futures = [pool.submit(work, a) for a in asks]
            wait(futures, return_when=FIRST_EXCEPTION)
            failed = next((f for f in futures if f.done() and f.exception() is not None), None)
            if failed is not None:
                raise failed.exception()
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)  # what was not sent yet is not sent
            self.client.close()  # the requests still in flight lose their connection: the server aborts them
            raise
        finally:
            bar.close()
        pool.shutdown(wait=True)
        return out
