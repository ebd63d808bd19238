#!/usr/bin/env python
"""Yes/No against JSON true/false answers, side by side: answer mass, frame agreement, time per probe.

For each model and vignette set, the same vignettes are probed in both answer formats
(``Probe(..., answer_format="yesno" | "json")``) and the script prints one table row per
(model, set, format):

- **answer mass** per frame: the mean probability, over the whole vocabulary, of the two
  answers at the answer position (Yes+No, or true+false), for the "wrong?" and the
  "acceptable?" questions, and its minimum over all prompts; also over the ``other_violate``
  texts alone (the originals: the issue's measurement), in a second table;
- **inter-frame agreement**: corr(P(Yes|wrong), 1 - P(Yes|acceptable)) (P(true) for JSON);
  +1 when the two questions get opposite answers, strongly negative under a yes-bias;
- **human r** (sets with ratings): corr of s(other_violate) with the human wrongness ratings;
- **time per probe**: the best wall time of ``Probe.run`` over ``--repeats`` runs, the formats
  interleaved so that both see the same load; and prompts per second;
- **tokens per probe**: the tokens the shared-prefix path feeds the model (the common header once,
  each scenario once, each question and pre-fill once; padding not counted): a cost figure that
  does not depend on the load.

Models: SmolLM2-135M-Instruct (fp32, real) and the tiny random Qwen3 (mechanics and vocabulary
cost only: its answer figures mean nothing). ``clifford`` is prepared into a temporary home from
the CSV at ``$TINYMCF_CLIFFORD_CSV`` (default ``../shared/data/clifford/vignettes.csv``) unless the
current home already holds it; without the CSV it is skipped, with a message.

    python -m benchmarks.answer_formats                        # both models, scifi and clifford
    python -m benchmarks.answer_formats --models smollm2 --sets clifford --repeats 3
    python -m benchmarks.answer_formats --limit 4 --repeats 1  # smoke run

The answer figures are deterministic; the timings depend on the machine's load (the script
prints the load average before and after).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

MODELS = ("smollm2", "tiny-qwen3")
SETS = ("scifi", "clifford")
FORMATS = ("yesno", "json")
CLIFFORD_CSV = Path(os.environ.get("TINYMCF_CLIFFORD_CSV", ROOT.parent / "shared" / "data" / "clifford" /
                                   "vignettes.csv"))


def load_model(which: str):
    """``(model, tokenizer)`` in fp32 on the CPU, eval mode, from the offline assets."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tinymcf_callback import testing as offline_assets

    if which == "smollm2":
        path = offline_assets.smollm2_dir()
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        return model.eval(), AutoTokenizer.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(offline_assets.qwen3_tokenizer_dir())
    return offline_assets.tiny_qwen3(seed=0).eval(), tok


def clifford_ready() -> bool:
    """Make ``clifford`` loadable: the current home's, or prepared from the CSV into a temporary home."""
    from tinymcf_callback.data.sets import load_vignettes
    from tinymcf_callback.errors import ProbeDataError

    try:
        load_vignettes("clifford")
        return True
    except ProbeDataError:
        pass
    if not CLIFFORD_CSV.exists():
        print(f"[answer-formats] clifford skipped: not prepared, and no CSV at {CLIFFORD_CSV} "
              "(set TINYMCF_CLIFFORD_CSV, or run tinymcf prepare --name clifford)")
        return False
    from tinymcf_callback.cli.main import main as tinymcf

    home = tempfile.mkdtemp(prefix="tinymcf_answer_formats_")
    if tinymcf(["prepare", "--name", "clifford", "--source", str(CLIFFORD_CSV), "--home", home]) != 0:
        raise SystemExit("[answer-formats] preparing clifford from the CSV failed (see above)")
    os.environ["TINYMCF_HOME"] = home
    return True


def figures(report: dict) -> dict:
    """The answer figures of one report: mass per frame, its minimum, frame agreement, human correlation."""
    raw, info = report["raw"], report["info"]
    mass = raw.groupby("frame")["yn_mass"].mean()
    originals = raw[raw["condition"] == "other_violate"].groupby("frame")["yn_mass"].mean()
    return {"mass_wrong": float(mass["wrong"]), "mass_accept": float(mass["accept"]),
            "ov_mass_wrong": float(originals["wrong"]), "ov_mass_accept": float(originals["accept"]),
            "mass_min": info["yn_mass_min"], "frame_agreement": info["frame_agreement"],
            "human_corr": info["human_corr"], "score": report["score"], "n_prompts": info["n_prompts"]}


def fed_tokens(probe) -> int:
    """Tokens the shared-prefix path runs: the common root once, each group's scenario once, every prompt's tail."""
    plan = probe.prefix_plan
    if plan is None:
        return sum(map(len, probe.encoded))
    return len(plan.root) + sum(map(len, plan.mid)) + sum(len(plan.tail(probe.encoded, i)) for i in range(len(probe)))


def measure(which: str, sets: list[str], limit: int | None, repeats: int) -> list[dict]:
    """Rows for one model: every set in both formats, the formats' timed runs interleaved."""
    from tinymcf_callback import Probe

    model, tok = load_model(which)
    rows = []
    for name in sets:
        probes = {fmt: Probe(tok, name, limit, answer_format=fmt) for fmt in FORMATS}
        times: dict[str, list[float]] = {fmt: [] for fmt in FORMATS}
        found: dict[str, dict] = {}
        for _ in range(repeats):
            for fmt, probe in probes.items():
                start = time.perf_counter()
                report = probe.run(model)
                times[fmt].append(time.perf_counter() - start)
                found.setdefault(fmt, figures(report))
        for fmt in FORMATS:
            best = min(times[fmt])
            rows.append({"model": which, "set": name, "answer_format": fmt, **found[fmt],
                         "tokens_per_probe": fed_tokens(probes[fmt]), "s_per_probe": best,
                         "s_per_probe_all": times[fmt], "prompts_per_s": found[fmt]["n_prompts"] / best})
            print(f"[answer-formats] {which} {name} {fmt}: mass {_mass(rows[-1]['mass_wrong'])} / "
                  f"{_mass(rows[-1]['mass_accept'])}, agreement {_f(rows[-1]['frame_agreement'])}, "
                  f"{best:.1f} s per probe", flush=True)
    return rows


def _f(x, spec: str = "+.3f") -> str:
    return "n/a" if x is None else format(x, spec)


def _mass(x: float) -> str:
    """Three decimals; random weights put ~1e-5 on the answers, shown as such rather than as 0.000."""
    return f"{x:.3f}" if x >= 0.001 else f"{x:.1e}"


def table(rows: list[dict]) -> str:
    """The rows as a markdown table."""
    head = ("model", "set", "answer format", "answer mass, wrong?", "answer mass, acceptable?", "min mass",
            "inter-frame agreement", "human r", "tokens per probe", "s per probe", "prompts/s")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = (r["model"], r["set"], "Yes/No" if r["answer_format"] == "yesno" else "JSON true/false",
                 _mass(r["mass_wrong"]), _mass(r["mass_accept"]), _mass(r["mass_min"]),
                 _f(r["frame_agreement"]), _f(r["human_corr"]), f"{r['tokens_per_probe']:,}",
                 f"{r['s_per_probe']:.2f}", f"{r['prompts_per_s']:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def originals_table(rows: list[dict]) -> str:
    """Answer mass over the ``other_violate`` texts only (the originals), per frame."""
    lines = ["| model | set | answer format | answer mass, wrong? | answer mass, acceptable? |",
             "|---|---|---|---|---|"]
    for r in rows:
        shown = "Yes/No" if r["answer_format"] == "yesno" else "JSON true/false"
        lines.append(f"| {r['model']} | {r['set']} | {shown} | {_mass(r['ov_mass_wrong'])} | "
                     f"{_mass(r['ov_mass_accept'])} |")
    return "\n".join(lines)


def cache_digest(name: str) -> str:
    """md5 of the shipped rewrite cache of ``name`` (the upholds change when the cache does)."""
    path = ROOT / "cache" / f"{name}.jsonl"
    return hashlib.md5(path.read_bytes()).hexdigest()[:12] if path.exists() else "n/a"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    p.add_argument("--sets", default=",".join(SETS), help=f"comma-separated, of {', '.join(SETS)}")
    p.add_argument("--limit", type=int, default=None, help="probe only the first N vignettes of each set")
    p.add_argument("--repeats", type=int, default=2, help="timed runs per (set, format); the best is kept (default 2)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    p.add_argument("--out", default=None, help="also write the rows as JSON here")
    args = p.parse_args(argv)
    models, sets = args.models.split(","), args.sets.split(",")
    unknown = [m for m in models if m not in MODELS] + [s for s in sets if s not in SETS]
    if unknown or args.repeats < 1 or (args.limit is not None and args.limit < 1):
        p.error(f"unknown model or set {unknown}, or --repeats / --limit below 1")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if "clifford" in sets and not clifford_ready():
        sets = [s for s in sets if s != "clifford"]
    load_before = os.getloadavg()
    print(f"[answer-formats] torch {torch.__version__}, {torch.get_num_threads()} threads, load average "
          f"{load_before[0]:.1f} on {os.cpu_count()} CPUs; caches: "
          + ", ".join(f"{s} {cache_digest(s)}" for s in sets), flush=True)
    rows = [row for which in models for row in measure(which, sets, args.limit, args.repeats)]
    load_after = os.getloadavg()
    print(table(rows))
    print("\nother_violate texts only (the originals):")
    print(originals_table(rows))
    print(f"[answer-formats] load average {load_before[0]:.1f} before, {load_after[0]:.1f} after on {os.cpu_count()} "
          f"CPUs (this script adds about {torch.get_num_threads()}): more than that means the timings ran under "
          "contention")
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "load_before": load_before, "load_after": load_after,
                                              "caches": {s: cache_digest(s) for s in sets}}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
