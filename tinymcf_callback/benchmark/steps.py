"""Two steps of a run compared: ``tinymcf compare RUN --steps A B``, the probe's change and the benchmark's.

Everything comes from the run's history files, whoever wrote them (the callback, ``ProbeLogger``, the sweep, the
watcher): the probe's lines hold each vignette's ``s``, so the probe's change ``B - A`` is the paired comparison two
reports give (:func:`~tinymcf_callback.views.comparison.compare`); the benchmark's lines beside them hold each
pair's margin and each lm-eval document's score, so its changes pair too (:mod:`.analysis`). For each benchmark
number the result says whether its change and the probe's score change agree in sign, disagree, or cannot tell
(:func:`~.analysis.agreement`). With three points a run gives two changes: agreement there is consistent with the
probe tracking the benchmark, never a measured correlation.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from ..errors import CompareError, HistoryError
from ..rundir.history import current_run, is_point, read_lines, resolve_history_path
from ..rundir.report import load_report
from ..stats.bootstrap import DEFAULT_LEVEL, DEFAULT_RESAMPLES
from ..views.comparison import compare, format_comparison, line_report
from .analysis import agreement, lm_eval_change, prefs_change
from .history import read_bench


def history_of(run: str | Path, name: str | None = None) -> Path:
    """The probe history of ``run`` (a history file, or a run folder holding it; ``name`` picks one of several)."""
    path = Path(run)
    if path.is_dir() and name is not None:
        found = sorted(p for p in path.glob("moral_probe_*.jsonl") if p.stem in (f"moral_probe_{name}",))
        if not found:
            raise HistoryError(f"{path} holds no moral_probe_{name}.jsonl history")
        return found[0]
    return resolve_history_path(path)


def bench_of(history: Path) -> Path:
    """The benchmark history beside a probe history: ``moral_bench_<key>.jsonl`` for ``moral_probe_<key>.jsonl``."""
    return history.with_name("moral_bench_" + history.name[len("moral_probe_"):])


def _probe_report(history: Path, lines: dict[int, dict], step: int) -> dict:
    """Step ``step``'s probe as a report: its line's scores, else the report the callback wrote for it."""
    label = f"{history.name} step {step}"
    line = lines.get(step)
    if line is None:
        steps = ", ".join(map(str, sorted(lines))) or "none"
        raise CompareError(f"{history} holds no probe at step {step} (its steps: {steps}); choose two of them")
    if line.get("scores"):
        return line_report(line, label)
    for report in (history.parent / f"checkpoint-{step}" / f"moral_probe_{line['name']}.json",
                   history.with_name(history.stem + "_baseline.json") if step == 0 else None):
        if report is not None and report.exists():
            return load_report(report)
    return line_report(line, label)  # says what is missing


def compare_steps(run: str | Path, a: int, b: int, *, name: str | None = None, level: float = DEFAULT_LEVEL,
                  n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0, allow_precision_change: bool = False) -> dict:
    """Steps ``a`` and ``b`` of a run: ``{"history", "probe": compare()'s result, "prefs": change or None,
    "lm_eval": {task: change}, "agreement": [{"what", "verdict", "why"}], "notes": [...]}`` (see the module)."""
    history = history_of(run, name)
    numbered = read_lines(history)
    lines = {line["step"]: line for _, line in current_run(history, numbered, warn=False) if is_point(line)}
    labels = (f"step {a}", f"step {b}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the result carries them
        probe = compare(_probe_report(history, lines, a), _probe_report(history, lines, b), level=level,
                        n_resamples=n_resamples, seed=seed, labels=labels,
                        allow_precision_change=allow_precision_change)
    out = {"history": str(history), "steps": (a, b), "probe": probe, "prefs": None, "lm_eval": {}, "agreement": [],
           "notes": []}
    score = probe["headline"]["score"]
    bench = {(line["step"], line["kind"]): line for line in read_bench(bench_of(history))}
    weights = {s: lines[s].get("fingerprint") for s in (a, b)}
    for kind in ("prefs", "lm_eval"):
        pair = [bench.get((s, kind)) for s in (a, b)]
        if not all(pair):
            if any(pair):
                out["notes"].append(f"the benchmark's {kind} result is at one of the two steps only")
            continue
        for s, line in zip((a, b), pair, strict=True):
            if None not in (line.get("fingerprint"), weights[s]) and line["fingerprint"] != weights[s]:
                out["notes"].append(f"step {s}: the benchmark's {kind} scored other weights than the probe's line "
                                    "(a checkpoint saved again): the two changes are not of the same model")
        if kind == "prefs":
            out["prefs"] = prefs_change(pair[0]["prefs"], pair[1]["prefs"], level=level, n_resamples=n_resamples,
                                        seed=seed)
            for what in ("accuracy", "margin"):
                verdict, why = agreement(score, out["prefs"][what])
                out["agreement"].append({"what": f"preference {what}", "verdict": verdict, "why": why})
        else:
            for task in pair[0]["lm_eval"]["tasks"]:
                if task in pair[1]["lm_eval"]["tasks"]:
                    change = lm_eval_change(pair[0]["lm_eval"], pair[1]["lm_eval"], task, level=level,
                                            n_resamples=n_resamples, seed=seed)
                    out["lm_eval"][task] = change
                    verdict, why = agreement(score, change)
                    out["agreement"].append({"what": f"lm-eval {task} {change['metric']}", "verdict": verdict,
                                             "why": why})
    return out


def _row(what: str, c: dict, level: str) -> str:
    num = lambda x: "n/a" if x is None else f"{x:+.3f}"  # noqa: E731
    interval = "n/a" if c.get("lo") is None else f"[{c['lo']:+.3f}, {c['hi']:+.3f}]"
    p = "n/a" if c.get("p") is None else ("<0.001" if c["p"] < 0.001 else f"{c['p']:.3f}")
    return f"  {what:<44} {num(c.get('a')):>8} {num(c.get('b')):>8} {num(c.get('change')):>8}  {interval:<18} {p}"


def format_steps(result: dict) -> str:
    """The comparison as text: the probe's table, then the benchmark's changes and whether they agree."""
    a, b = result["steps"]
    lines = [format_comparison(result["probe"], (f"step {a}", f"step {b}"))]
    level = f"{result['probe']['level']:.0%}"
    bench = []
    if result["prefs"]:
        p = result["prefs"]
        bench += [_row("preference accuracy", p["accuracy"], level),
                  _row("preference margin (nats)", p["margin"], level)]
        bench += [_row(f"  {r['config']} accuracy", r["accuracy"], level) for r in p["configs"]]
    for task, c in result["lm_eval"].items():
        paired = "paired" if c["paired"] else "unpaired"
        bench.append(_row(f"lm-eval {task} {c['metric']} ({paired})", c, level))
    if bench:
        lines += ["", f"[tinymcf] the benchmark beside the run, change B - A with {level} intervals (pairs and "
                      "documents paired across the steps)",
                  f"  {'':<44} {'A':>8} {'B':>8} {'change':>8}  {level + ' interval':<18} p", *bench, ""]
        score = result["probe"]["headline"]["score"]
        change, lo, hi = score.get("change"), score.get("lo"), score.get("hi")
        shown = "n/a" if change is None else f"{change:+.3f}" + ("" if lo is None else f" [{lo:+.3f}, {hi:+.3f}]")
        lines.append(f"[tinymcf] the probe's score changed by {shown}")
        for row in result["agreement"]:
            lines.append(f"[tinymcf] {row['what']}: {row['verdict']} ({row['why']})")
        lines.append("[tinymcf] with a run's three points, agreement in sign says the probe moved as the benchmark "
                     "did between these two steps; it is not a correlation across models")
    else:
        lines += ["", f"[tinymcf] no benchmark result at both steps in {bench_of(Path(result['history'])).name} "
                      "(--prefs / --lm-eval of the sweep, the watcher or the callback write it)"]
    lines += [f"[tinymcf] NOTE: {n}" for n in result["notes"]]
    return "\n".join(lines)
