"""The one request loop of ``prepare`` and ``validate``: ask for each planned item, keep each good answer.

The callers plan *what is missing* without a key or a network; :func:`run_job` runs those requests and appends every
answer that passes the rules the moment it arrives, so an interrupted run loses nothing finished and a rerun asks
only for the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from ..apiclient import Cancelled
from ..errors import PrepareError
from .llm import ChatClient, FatalLLMError, ItemFailed, ask_json, find_api_key, no_key_message, run_pool
from .store import append_entry


def model_list(primary: str, fallback: str | None) -> list[str]:
    """The models to ask, in order: ``primary``, then ``fallback`` when it is another one."""
    return [primary] + ([fallback] if fallback and fallback != primary else [])


def open_client(args, secrets: list, what: str) -> ChatClient:
    """A client for ``--base-url`` with the API key; ``what`` says in the no-key error why one is needed.

    The key joins ``secrets`` so that no later message can show it.
    """
    key, _where = find_api_key()
    if not key:
        raise PrepareError(no_key_message(what))
    secrets.append(key)
    return ChatClient(args.base_url, key, timeout=args.timeout, retries=args.retries, backoff=args.backoff,
                      json_mode=not args.no_json_mode)


@dataclass(frozen=True)
class Job:
    """What to ask for each item, how to check the answer, and which line to append for it."""

    what: str  # "rewrites" or "judgements", for messages
    name: str  # the set, for the progress bar
    path: Path  # the JSONL file good answers are appended to
    models: list[str]
    messages: Callable[[object, list | None], list[dict]]  # (item, feedback) -> chat messages
    check: Callable[[object], Callable[[dict], tuple[object, list[str]]]]  # item -> (answer -> (value, problems))
    entry: Callable[[object, object, str], dict]  # (item, value, model) -> the line to append


class Outcome(NamedTuple):
    done: list[dict]  # the entries appended, in the order they arrived
    failed: list[tuple[object, str]]  # (item, reason); never written


def run_job(job: Job, items: list, client: ChatClient, *, concurrency: int, attempts: int, progress: bool | None,
            say: Callable[[str], None]) -> Outcome:
    """Ask for every item and append each answer that passes ``job.check``; Ctrl-C is re-raised."""
    done: list[dict] = []
    failed: list[tuple[object, str]] = []

    def work(item):
        return ask_json(client, job.models, lambda feedback: job.messages(item, feedback), job.check(item),
                        attempts=attempts)

    def on_result(item, res):  # runs under the pool's lock, the moment the request finishes
        if isinstance(res, ItemFailed):
            failed.append((item, str(res)))
        elif not isinstance(res, Cancelled):
            value, model = res
            entry = job.entry(item, value, model)
            append_entry(job.path, entry)
            done.append(entry)

    try:
        run_pool(items, work, concurrency=concurrency, cancel=client.cancel, on_result=on_result,
                 desc=f"{job.what} {job.name}", progress=progress)
    except KeyboardInterrupt:
        say(f"interrupted: {len(done)} new {job.what} saved in {job.path} so far (requests in flight are saved as "
            f"they finish); rerun the same command to finish.")
        raise
    except FatalLLMError as e:
        raise PrepareError(f"{e} ({len(done)} {job.what} made before this are saved in {job.path})") from None
    return Outcome(done, failed)
