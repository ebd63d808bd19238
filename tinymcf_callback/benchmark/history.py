"""The benchmark's lines beside the probe's history: ``<output_dir>/moral_bench_<name>.jsonl``, one line per result.

The probe's curve (``moral_probe_<name>.jsonl``) holds one kind of line, read by many (the sweep's and the watcher's
planner, the plot, the trackers' figure, the run-level numbering of change tests); the benchmark's results at a few
steps go in a file of their own beside it, named after the same probe, so no reader of the probe's history meets a
line it does not know, and ``moral_probe_*.jsonl`` still finds the one history of a run. A line holds one result:
``kind`` ``prefs`` (the preference pairs) or ``lm_eval`` (lm-eval's tasks), at a ``step`` with its ``at`` (start,
middle, end, step), what was scored (``fingerprint``, the checkpoint's weight digest, the probe's rule; the precision
fields) and the result's block (:data:`~.analysis.PREFS_FIELDS`, :data:`~.lmeval.LM_EVAL_FIELDS`), whose source
record, token digest, lm-eval and task versions say what was asked. ``metrics`` are the logged names
(``eval_moral_<name>/prefs/accuracy``, ...), what the dashboards show at the Trainer's step.

Reading rules, as the probe's history has them (:mod:`~tinymcf_callback.rundir.history`): a step-0 ``train_begin``
line after lines of later steps starts a new run written into the same folder; within the run, the last line of a
(step, kind) wins; a torn last line is skipped; a line that is not a benchmark line is refused, naming the file and
the line. Appends go through the probe's history writer (one line, one ``write``, under the file's lock).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from .._io import read_jsonl
from ..errors import HistoryError
from ..rundir.history import append_line
from ..stats.metrics import BASELINE_EVENT, probe_key, slug

KINDS = ("prefs", "lm_eval")
BENCH_LINE_FIELDS = {
    "step": ("integer", "the training step (0: the run's starting weights)"),
    "epoch": ("number or null", "the training epoch"),
    "event": ("string", "what scored it: train_begin (step 0), save, train_end (the callback), sweep, watch"),
    "kind": ("string", "prefs (the preference pairs) or lm_eval (lm-eval's tasks)"),
    "at": ("list", "why this step: start, middle, end, step (given with --at, or every save with --at all)"),
    "name": ("string", "the probe whose run this is (its history is moral_probe_<name>.jsonl)"),
    "answer_format": ("string", "that probe's answer format"),
    "model": ("string", "the model's name or path"),
    "device": ("string", "where it ran"), "dtype": ("string", "the weights' dtype"),
    "autocast": ("string or null", "autocast dtype, or null"),
    "compute": ("string", "what the matrix products ran in"),
    "fingerprint": ("string or null", "what was scored: the checkpoint's weight digest (the probe's rule); null for "
                                      "a live model between saves"),
    "by": ("string", "callback, sweep or watch"),
    "prefs": ("object", "kind prefs: the prefs block (below)"),
    "lm_eval": ("object", "kind lm_eval: the lm_eval block (below)"),
    "metrics": ("object", "the logged metrics (eval_moral_<name>/prefs/accuracy, ...): what the dashboards show"),
    "versions": ("object", "tinymcf_callback, torch, transformers and python versions"),
}


def bench_path(output_dir: str | os.PathLike, name: str, answer_format: str) -> Path:
    """``<output_dir>/moral_bench_<name>.jsonl`` (``..._<name>_json.jsonl`` with JSON answers), beside the probe's."""
    return Path(output_dir) / f"moral_bench_{probe_key(name, answer_format)}.jsonl"


def bench_metrics(name: str, answer_format: str, kind: str, block: dict) -> dict[str, float]:
    """The logged names of one result (finite values only): ``eval_moral_<key>/prefs/accuracy`` with ``_lo``/``_hi``,
    ``margin`` the same, and per config ``eval_moral_<key>/prefs/<config>/accuracy``, ``.../margin``; lm-eval's
    ``eval_moral_<key>/lm_eval/<task>/<metric>`` and ``<metric>_stderr``."""
    prefix = f"eval_moral_{probe_key(name, answer_format)}/{kind}"
    values: dict[str, float | None] = {}
    if kind == "prefs":
        for field in ("accuracy", "margin"):
            for end in ("", "_lo", "_hi"):
                values[f"{prefix}/{field}{end}"] = block.get(f"{field}{end}")
        for row in block.get("configs") or []:
            for field in ("accuracy", "margin"):
                values[f"{prefix}/{slug(row['config'])}/{field}"] = row.get(field)
    else:
        for task, r in block["tasks"].items():
            values[f"{prefix}/{task}/{r['metric']}"] = r.get("value")
            values[f"{prefix}/{task}/{r['metric']}_stderr"] = r.get("stderr")
    return {k: float(v) for k, v in values.items() if v is not None and math.isfinite(float(v))}


def bench_line(kind: str, block: dict, *, name: str, answer_format: str, step: int, epoch, event: str,
               at: tuple[str, ...] | list[str], model: str | None, fingerprint: str | None, by: str,
               versions: dict) -> dict:
    """One result as a benchmark line (its fields: :data:`BENCH_LINE_FIELDS`)."""
    precision = block.get("precision") or {}
    return {"step": step, "epoch": epoch, "event": event, "kind": kind, "at": list(at), "name": name,
            "answer_format": answer_format, "model": model, "device": precision.get("device"),
            "dtype": precision.get("dtype"), "autocast": precision.get("autocast"),
            "compute": precision.get("compute"), "fingerprint": fingerprint, "by": by, kind: block,
            "metrics": bench_metrics(name, answer_format, kind, block), "versions": versions}


def asked(line: dict) -> str | None:
    """What a line's result asked, whatever the tokenizer: the pairs' digest, or lm-eval's tasks and limit."""
    block = line.get(line.get("kind")) or {}
    if line.get("kind") == "prefs":
        return (block.get("source") or {}).get("digest")
    return asked_tasks(block.get("requested") or [], block.get("limit"))


def asked_tasks(tasks, limit) -> str:
    """lm-eval's question: its tasks as asked and its limit."""
    return ",".join(sorted(tasks)) + f"|{limit}"


def append_bench(path: str | os.PathLike, line: dict) -> None:
    """Append one line under the file's lock, whole or not at all (``OSError`` naming the file when it cannot)."""
    append_line(path, line)


def read_bench(path: str | os.PathLike) -> list[dict]:
    """The current run's lines of the benchmark history at ``path`` (none when it does not exist), each checked;
    the newest line of each (step, kind), in step order."""
    path = Path(path)
    if not path.exists():
        return []
    try:
        lines = read_jsonl(path, torn_tail=True)
    except ValueError as e:
        raise HistoryError(f"malformed benchmark line: {e}") from None
    except OSError as e:
        raise HistoryError(f"cannot read {path}: {e.strerror}") from None
    for lineno, line in lines:
        _check(path, lineno, line)
    run: list[dict] = []
    for _, line in lines:
        if line["step"] == 0 and line.get("event") == BASELINE_EVENT and any(r["step"] > 0 for r in run):
            run = []  # a new run written into the same folder
        run.append(line)
    newest = {(line["step"], line["kind"]): line for line in run}
    return [newest[k] for k in sorted(newest)]


def _check(path: Path, lineno: int, line) -> None:
    hint = "not a benchmark line (moral_bench_<name>.jsonl is written by --prefs / --lm-eval); repair or remove it"
    if not isinstance(line, dict):
        raise HistoryError(f"{path}:{lineno}: {hint}")
    step, kind = line.get("step"), line.get("kind")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise HistoryError(f"{path}:{lineno}: {hint}: 'step' is {step!r}")
    if kind not in KINDS or not isinstance(line.get(kind), dict) or not isinstance(line.get("metrics"), dict):
        raise HistoryError(f"{path}:{lineno}: {hint}: 'kind' is {kind!r}")


def result_lines(result: dict, *, name: str, answer_format: str, step: int, epoch, event: str, at, model: str | None,
                 fingerprint: str | None, by: str, versions: dict) -> list[dict]:
    """The lines of a :meth:`~.runner.Benchmark.run` result: one per kind it holds (prefs, then lm_eval)."""
    return [bench_line(kind, result[kind], name=name, answer_format=answer_format, step=step, epoch=epoch,
                       event=event, at=at, model=model, fingerprint=fingerprint, by=by, versions=versions)
            for kind in KINDS if result.get(kind)]
