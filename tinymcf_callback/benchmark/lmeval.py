"""lm-evaluation-harness beside the probe: its own tasks, run through its own Python API on the model already loaded.

:func:`run_tasks` wraps the model (same weights, same precision, same device) in lm-eval's ``HFLM`` and calls
``lm_eval.simple_evaluate`` on it, so every number is lm-eval's: its prompts, its metric, its standard error, its
task versions. Tasks are lm-eval's names (``ethics_cm``, the ``hendrycks_ethics`` group, ...) or tasks of a local
folder (``include=``, lm-eval's ``include_path``): a task whose data is a local file runs offline. Each document's
score is kept too (``log_samples``), so a change between two checkpoints pairs over the documents
(:func:`~.analysis.lm_eval_change`).

What lm-eval would change is kept from the model and its tokenizer: it gets a copy of the tokenizer (it may set a
pad token), and the run happens inside the probe's mode (eval mode, inference mode, every RNG state and module flag
restored after: lm-eval seeds Python's, numpy's and torch's generators).
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import logging
import time
from pathlib import Path

from ..errors import BenchmarkError
from ..extras import require

logger = logging.getLogger(__name__)

LM_EVAL_BATCH = 16  # requests per forward call of lm-eval's HFLM
# the lm_eval block of a report and a history line, field by field (the docs' table is made from it)
LM_EVAL_FIELDS = {
    "version": ("string", "the lm-evaluation-harness version"),
    "requested": ("list", "the task names asked for (a group's tasks are in tasks)"),
    "tasks": ("object", "per task: metric (its first), value, stderr (as lm-eval reports them), n (documents), "
                        "version (the task's), metrics (every metric lm-eval reported), docs (doc_id and value of "
                        "each document, for a paired change)"),
    "include_path": ("string or null", "the local task folder"),
    "limit": ("integer or null", "documents per task (lm-eval's limit)"),
    "precision": ("object", "dtype, autocast, device, compute: what the forward calls computed in"),
    "elapsed_s": ("number", "seconds lm-eval took"),
}


def task_manager(tasks: list[str], include: str | None = None):
    """lm-eval's ``TaskManager`` knowing ``tasks`` (only the local folder's when they are all there: indexing every
    task lm-eval ships takes seconds); :class:`~tinymcf_callback.errors.BenchmarkError` naming an unknown task and
    the nearest known ones."""
    require("lm_eval")
    from lm_eval.tasks import TaskManager

    if include is not None and not Path(include).is_dir():
        raise BenchmarkError(f"--lm-eval-include {include}: no such folder (a folder of lm-eval task yaml files)")
    with quiet():
        if include is not None:
            local = TaskManager(include_path=include, include_defaults=False)
            if all(t in local.all_tasks for t in tasks):
                return local
        manager = TaskManager(include_path=include)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        near = difflib.get_close_matches(unknown[0], manager.all_tasks, n=4)
        hint = f"; nearest: {', '.join(near)}" if near else ""
        where = f" or in {include}" if include else " (a local task folder: --lm-eval-include DIR)"
        raise BenchmarkError(f"lm-eval has no task {', '.join(map(repr, unknown))}{where}{hint}; `lm_eval ls tasks` "
                             "lists them")
    return manager


@contextlib.contextmanager
def quiet(level: int = logging.ERROR):
    """lm-eval's own log lines held to ``level`` for the block (it warns at length about a model passed as an
    object, which is what this bridge does on purpose)."""
    lm_logger = logging.getLogger("lm_eval")
    before = lm_logger.level
    lm_logger.setLevel(level)
    try:
        yield
    finally:
        lm_logger.setLevel(before)


def run_tasks(model, tok, tasks: list[str], *, include: str | None = None, limit: int | None = None,
              batch_size: int = LM_EVAL_BATCH, manager=None) -> dict:
    """lm-eval's results for ``tasks`` on ``model`` (see the module): the ``lm_eval`` block of a report."""
    lm_eval = require("lm_eval")
    from lm_eval.models.huggingface import HFLM

    from ..scoring.mode import probe_mode

    manager = manager or task_manager(tasks, include)
    started = time.perf_counter()
    with probe_mode(model) as precision, quiet():
        lm = HFLM(pretrained=model, tokenizer=copy.deepcopy(tok), batch_size=batch_size)
        try:
            out = lm_eval.simple_evaluate(model=lm, tasks=list(tasks), task_manager=manager, limit=limit,
                                          log_samples=True, verbosity="ERROR")
        except Exception as e:
            if _reading_data(e):
                raise BenchmarkError(f"lm-eval could not read the data of {', '.join(tasks)}: {_one_line(e)}; "
                                     f"{_data_hint()}") from None
            raise
    return {"version": lm_eval.__version__, "requested": list(tasks), "tasks": _task_results(out),
            "include_path": include, "limit": limit, "precision": precision.as_dict(),
            "elapsed_s": time.perf_counter() - started}


def _task_results(out: dict) -> dict:
    tasks = {}
    samples = out.get("samples") or {}
    for task, values in out["results"].items():
        metrics = {k.split(",")[0]: v for k, v in values.items()
                   if k not in ("alias", "sample_len") and isinstance(v, (int, float))}
        listed = [m["metric"] for m in (out.get("configs", {}).get(task, {}).get("metric_list") or [])
                  if isinstance(m, dict) and "metric" in m]
        primary = next((m for m in listed if m in metrics), next((m for m in metrics if not m.endswith("_stderr")),
                                                                   None))
        if primary is None:
            continue
        docs = samples.get(task) or []
        tasks[task] = {"metric": primary, "value": _float(metrics[primary]),
                       "stderr": _float(metrics.get(f"{primary}_stderr")),
                       "n": (out.get("n-samples", {}).get(task) or {}).get("effective"),
                       "version": _plain_version(out.get("versions", {}).get(task)), "metrics": metrics,
                       "docs": {"doc_id": [int(d["doc_id"]) for d in docs if primary in d],
                                "value": [_float(d[primary]) for d in docs if primary in d]}}
    return tasks


def _float(x) -> float | None:
    try:
        value = float(x)
    except (TypeError, ValueError):
        return None
    return value if value == value and abs(value) != float("inf") else None


def _plain_version(v):
    return v if isinstance(v, (int, float, str)) or v is None else str(v)


def _reading_data(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) comes from reading a task's data: ``datasets``, the Hub, the network."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        module = type(error).__module__ or ""
        if module.startswith(("datasets", "huggingface_hub", "requests", "urllib3", "fsspec")) or isinstance(
                error, (ConnectionError, FileNotFoundError)):
            return True
        error = error.__cause__ or error.__context__
    return False


def _data_hint() -> str:
    import os

    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return ("the Hub is off (HF_HUB_OFFLINE=1) and the data set is not in the Hugging Face datasets cache: run "
                "once with the Hub reachable, or use a local task folder whose data is a local file "
                "(--lm-eval-include)")
    return "check the network, or use a local task folder whose data is a local file (--lm-eval-include)"


def _one_line(error: Exception) -> str:
    return f"{type(error).__name__}: {' '.join(str(error).split())[:240]}"
