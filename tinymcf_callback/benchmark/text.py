"""The benchmark's results and changes as the lines a command prints."""

from __future__ import annotations


def _num(x, fmt: str = "+.3f") -> str:
    return "n/a" if x is None else format(x, fmt)


def _bounds(row: dict, name: str, fmt: str) -> str:
    value, lo, hi = row.get(name), row.get(f"{name}_lo"), row.get(f"{name}_hi")
    if lo is None or hi is None:
        return _num(value, fmt)
    return f"{_num(value, fmt)} [{_num(lo, fmt)}, {_num(hi, fmt)}]"


def prefs_lines(block: dict) -> list[str]:
    """A prefs block: the headline with its interval, then one line per config."""
    level = f"{block['level']:.0%}"
    source = block["source"]
    lines = [f"[tinymcf] preference pairs {source['source']} ({block['n_pairs']} pairs, {len(block['configs'])} "
             f"config{'s' * (len(block['configs']) != 1)}, {block['template']}): accuracy "
             f"{_bounds(block, 'accuracy', '.3f')}, margin {_bounds(block, 'margin', '+.3f')} nats ({level} "
             "intervals, pairs resampled within configs)"]
    for row in block["configs"]:
        lines.append(f"[tinymcf]   {row['config']:<20} n={row['n']:<5} accuracy {_bounds(row, 'accuracy', '.3f')}  "
                     f"margin {_bounds(row, 'margin', '+.3f')}")
    check = block.get("self_check")
    if check:
        said = (f"checked against each sequence alone ({check['reference']}): {check['max_diff']:.1e} nats a token "
                f"at most, tolerance {check['tolerance']:.0e}") if not check.get("note") else check["note"]
        lines.append(f"[tinymcf]   {block['strategy']} strategy, {block['n_forward']} forward calls, "
                     f"{block['elapsed_s']:.1f} s; {said}")
    return lines


def lm_eval_lines(block: dict) -> list[str]:
    lines = []
    for task, r in block["tasks"].items():
        err = f" ± {r['stderr']:.3f} (stderr)" if r.get("stderr") is not None else ""
        lines.append(f"[tinymcf] lm-eval {block['version']} {task} (version {r.get('version')}, {r.get('n')} "
                     f"documents): {r['metric']} {_num(r['value'], '.3f')}{err}")
    return lines


def benchmark_lines(result: dict) -> list[str]:
    lines = []
    if result.get("prefs"):
        lines += prefs_lines(result["prefs"])
    if result.get("lm_eval"):
        lines += lm_eval_lines(result["lm_eval"])
    return lines
