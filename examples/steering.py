#!/usr/bin/env python
"""Does a steering vector move the probe beyond what any push of its size does? A dose-response with its control.

SmolLM2-135M-Instruct, fp32 on the CPU. The "real" direction is a difference of means: the mean
residual after decoder layer ``--layer`` (default 15 of 30) at the answer position, over the
demo's training situations labelled wrong, minus that over those labelled acceptable
(``examples/demo_data.jsonl``: 30 and 30, asked "Is this morally wrong?" as the probe asks; none of
them is a probe vignette). It is added, times ``c``, to the residual stream at every position
(``ResidualSteering``), for each coefficient, and the probe (``per_foundation=2``: 2 vignettes of
each of the 7 foundations) scores the steered model. The control: the same intervention along
``--n-random`` random directions of the same norm (seeded).

For each coefficient: the change of the score since ``c = 0`` (paired, 95% interval), the range of
the random directions' changes, whether the real one lies beyond it, the Yes+No mass and the frame
agreement (a model that stops answering gives soft numbers), and, per foundation, whether its
``align_other`` moved beyond the random range.

    python examples/steering.py                # the measurement (~5 min on 2 idle CPU cores)
    python examples/steering.py --quick        # smoke run of the mechanics

Writes, under ``--output-dir`` (default ``runs/steering``): the dose history
``moral_probe_scifi_dose.jsonl``, ``steering.png`` (``tinymcf plot --x coefficient``: headline
panels, the random band shaded), ``steering.json`` and ``steering.md`` (the tables, also printed).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import demo  # noqa: E402 - the demo's data and offline set-up


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output-dir", default=str(ROOT / "runs" / "steering"), help="default: runs/steering")
    p.add_argument("--layer", type=int, default=15, help="decoder layer after which c * v is added (default 15)")
    p.add_argument("--coefficients", default="-32,-16,-8,8,16,32", help="comma-separated c (0 is always added)")
    p.add_argument("--n-random", type=int, default=4, help="random directions of the same norm (default 4)")
    p.add_argument("--per-foundation", type=int, default=2, help="probed vignettes per foundation (default 2)")
    p.add_argument("--at", choices=("every", "answer"), default="every", help="positions steered (default every)")
    p.add_argument("--quick", action="store_true", help="2 coefficients, 1 random direction, 1 vignette each")
    args = p.parse_args(argv)
    if args.quick:
        args.coefficients, args.n_random, args.per_foundation = "-4,4", 1, 1
    args.coefficients = [float(c) for c in args.coefficients.split(",") if c.strip()]
    return args


def fmt(x, spec="+.3f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def verdict(row) -> str:
    """The rank test's p and verdict (none when too few random directions could reach the level)."""
    if row.rank_p is None or row.rank_p != row.rank_p:
        return "n/a"
    if row.beyond_random is None:
        return f"p {row.rank_p:.2f} (too few random directions for a verdict)"
    return f"p {row.rank_p:.2f}: " + (f"**more, {row.direction}**" if row.beyond_random else "no more")


def markdown(result, args, norms: dict, seconds: float) -> str:
    control = result.control()
    base = result.base
    lines = [f"Real direction: mean residual difference (wrong minus acceptable demo situations) after layer "
             f"{args.layer}, norm {norms['v']:.2f} (the residual at the answer position has norm "
             f"{norms['h']:.1f} on average); added at {args.at} position(s). Probe: scifi, per_foundation="
             f"{args.per_foundation} ({base['info']['n_vignettes']} vignettes, {base['info']['n_prompts']} prompts). "
             f"Unsteered: score {fmt(base['score'])}, Yes+No mass {fmt(base['info']['yn_mass_mean'], '.3f')}. "
             f"Control: {result.n_random} random directions of the same norm. {seconds:.1f} s per probe on average.",
             "",
             "| c | score change [95%], p | random directions' change (min .. max) | rank test against them | "
             "Yes+No mass | frame agreement |",
             "|---|---|---|---|---|---|"]
    for row in control.itertuples():
        rep = result.reports[("real", 0, row.coefficient)]
        flag = "" if row.answering else " (below 0.5)"
        beyond = verdict(row)
        lines.append(f"| {row.coefficient:+g} | {fmt(row.real)} [{fmt(row.real_lo)}, {fmt(row.real_hi)}], p "
                     f"{fmt(result.changes[('real', 0, row.coefficient)]['headline']['score'].p, '.3f')} | "
                     f"{fmt(row.random_min)} .. {fmt(row.random_max)} | {beyond} | "
                     f"{fmt(rep['info']['yn_mass_mean'], '.3f')}{flag} | {fmt(rep['info']['frame_agreement'])} |")
    per = result.foundations()
    biggest = max(args.coefficients, key=abs)
    at = per[per["coefficient"] == biggest]
    lines += ["", f"Per foundation at c = {biggest:+g}: change of `align_other` (real) against the random range:", "",
              "| foundation | real change [95%] | random (min .. max) | rank test against them |", "|---|---|---|---|"]
    for row in at.itertuples():
        beyond = verdict(row)
        lines.append(f"| {row.foundation} | {fmt(row.real)} [{fmt(row.real_lo)}, {fmt(row.real_hi)}] | "
                     f"{fmt(row.random_min)} .. {fmt(row.random_max)} | {beyond} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    demo.offline_environment()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tinymcf_callback import Probe, ResidualSteering, dose_response, residual_direction
    from tinymcf_callback import testing as offline_assets
    from tinymcf_callback.figures.plot import plot_histories
    from tinymcf_callback.steering.hooks import decoder_layers

    out = Path(args.output_dir).resolve()
    dose = out / "moral_probe_scifi_dose.jsonl"
    if dose.exists():
        raise SystemExit(f"steering: {dose} exists already (an earlier measurement); pass another --output-dir or "
                         f"move it away")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    model_dir = offline_assets.smollm2_dir()
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rows = demo.load_situations()
    wrong = [r["situation"] for r in rows if r["wrong"]]
    fine = [r["situation"] for r in rows if not r["wrong"]]
    v = residual_direction(model, tok, wrong, fine, args.layer)
    norms = {"v": float(v.norm())}
    seen = []
    handle = decoder_layers(model)[args.layer].register_forward_hook(
        lambda m, a, o: seen.append((o if torch.is_tensor(o) else o[0])[:, -1].norm(dim=-1)))
    residual_direction(model, tok, wrong[:8], fine[:8], args.layer)  # the residual's own size, for scale
    handle.remove()
    norms["h"] = float(torch.cat(seen).mean())
    print(f"[steering] direction from {len(wrong)} wrong and {len(fine)} acceptable demo situations, layer "
          f"{args.layer}: |v| = {norms['v']:.2f}, mean |h| at the answer = {norms['h']:.1f}")

    probe = Probe(tok, "scifi", per_foundation=args.per_foundation)
    steer = ResidualSteering(model, args.layer, v, at=args.at)
    t1 = time.perf_counter()
    result = dose_response(probe, model, steer, args.coefficients, n_random=args.n_random, seed=0, output_dir=out)
    per_probe = (time.perf_counter() - t1) / len(result.reports)
    table = markdown(result, args, norms, per_probe)
    plot_histories([dose], out / "steering.png", x="coefficient", panels="headline")
    (out / "steering.md").write_text(table + "\n", encoding="utf-8")
    (out / "steering.json").write_text(json.dumps({
        "args": vars(args), "norms": norms, "seconds_per_probe": per_probe, "wall_s": time.perf_counter() - t0,
        "control": result.control().to_dict(orient="records"),
        "foundations": result.foundations().to_dict(orient="records"),
        "table": result.table().to_dict(orient="records")}, indent=2, default=str) + "\n", encoding="utf-8")
    print(result.summary())
    print()
    print(table)
    print(f"\n[steering] {len(result.reports)} probes in {time.perf_counter() - t1:.0f}s ({per_probe:.1f}s each); "
          f"wrote {out / 'steering.md'}, {out / 'steering.png'}, {dose}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
