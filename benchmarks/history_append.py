"""What one history line costs a follower as the history grows: numbering it and appending it at line 10 and at
line 10,000 (issue 42: the numbering re-read the whole history for every line, quadratic in a long run).

Each line is written as a watcher writes it (:mod:`tinymcf_callback.follow.rounds`): ``Curve.number`` (its run-level
change p, its test the next of the run's) then ``Curve.append(once=True)`` (under the history's lock, nothing written
when the step's newest line already records the same weights), every line a made-up change test of the usual size
(a seven-foundation table, the logged metrics). Beside it, the whole-history read the two did for every line before
(``Curve.read`` for the count, a fresh ``CurrentRun`` for the once-check), timed at the same lengths.

It writes ``benchmarks/history_append.json`` and prints the table.

    python -m benchmarks.history_append            # ~1 min on 2 cores (every append is fsync'd)
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tinymcf_callback.rundir.curve import Curve
from tinymcf_callback.rundir.history import CurrentRun

ROOT = Path(__file__).resolve().parents[1]
LINES = 10_000
AT = (10, 1_000, 10_000)  # the line numbers timed (the median of the WINDOW appends ending there)
WINDOW = 9
FOUNDATIONS = ("care", "fairness", "loyalty", "authority", "sanctity", "liberty", "social")


def made_up_line(step: int) -> dict:
    """A history line of the usual size (~3 kB): a change test with a seven-foundation table."""
    metrics = {f"eval_moral_scifi/{k}": 0.1 for k in ("score", "score_lo", "score_hi", "gap", "score_change",
                                                      "score_change_lo", "score_change_hi", "yn_mass")}
    metrics["eval_moral_scifi/score_change_p"] = 0.2
    table = [{"foundation": f, **{c: 0.5 for c in ("align_other", "align_other_lo", "align_other_hi", "align_self",
                                                     "s_other_violate", "s_self_uphold", "gap", "n")}}
             for f in FOUNDATIONS]
    return {"step": step, "epoch": step / 100, "event": "watch", "name": "scifi", "answer_format": "yesno",
            "model": f"checkpoint-{step}", "device": "cpu", "dtype": "float32", "autocast": None,
            "compute": "float32", "score": 0.1, "metrics": metrics, "info": {}, "table": table,
            "fingerprint": f"{step:020d}", "prompt_digest": "0" * 64}


def main() -> int:
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        curve = Curve(tmp, "scifi", "yesno")
        curve.append({**made_up_line(0), "event": "train_begin", "metrics": {}})
        times = []
        for step in range(1, LINES + 1):
            line = made_up_line(step)
            start = time.perf_counter()
            curve.number(line)
            assert curve.append(line, once=True)
            times.append(time.perf_counter() - start)
            if step in AT:
                start = time.perf_counter()
                count = len(curve.read().lines)
                CurrentRun(curve.path).catch_up()
                whole = time.perf_counter() - start
                rows[step] = {"append_ms": 1000 * statistics.median(times[-WINDOW:]),
                              "whole_read_ms": 1000 * whole, "lines": count,
                              "history_kb": curve.path.stat().st_size / 1024}
        assert line["metrics"]["eval_moral_scifi/score_change_p_run"] == 1.0  # test 10,000: numbered to the end
    first, last = rows[AT[0]]["append_ms"], rows[AT[-1]]["append_ms"]
    result = {"lines": LINES, "window": WINDOW, "at": {str(k): v for k, v in rows.items()},
              "ratio_last_to_first": last / first, "python": sys.version.split()[0]}
    (ROOT / "benchmarks" / "history_append.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'line':>7} {'history':>9} {'number+append':>14} {'whole read (before)':>20}")
    for step, row in rows.items():
        print(f"{step:>7,} {row['history_kb']:>7.0f}kB {row['append_ms']:>11.2f} ms {row['whole_read_ms']:>17.1f} ms")
    print(f"number+append at line {AT[-1]:,} / at line {AT[0]}: {last / first:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
