"""``tinymcf eval --model PATH_OR_ID``: score one model, print what it says, write its JSON report.

With ``--prefs`` and ``--lm-eval`` the slow benchmark runs on the same loaded model and the report holds its blocks.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ConfigError, LoadError
from ..extras import require
from ..loading import load_model, load_tokenizer
from ..scoring.prompts import DEFAULT_ANSWER_FORMAT
from .bench_options import add_benchmark_options, benchmark_config
from .options import add_home, add_loading, add_probe_options, add_progress, add_served, probe_config, served_config

NAME = "eval"
SUMMARY = "score one model and write its JSON report"
USAGE = "%(prog)s --model PATH_OR_ID [options, by group below]"


def add_arguments(p) -> None:
    p.add_argument("--model", required=True, help="a local model folder or a Hugging Face id (with --endpoint: the "
                                                  "name the server serves)")
    p.add_argument("--tag", default=None, help="label for this run, e.g. step_500 (default: the model folder's name)")
    p.add_argument("--out", default=None, help="folder for the JSON report (default: the current folder)")
    p.add_argument("--gguf-file", default=None, help="a GGUF file inside --model, for GGUF checkpoints")
    p.add_argument("--json", default=None, metavar="FILE",
                   help="write the report to FILE (default: --out/eval_<name>_<tag>.json)")
    add_loading(p)
    add_served(p)
    add_benchmark_options(p)
    add_home(p)
    add_progress(p)
    add_probe_options(p, skip=("target",))  # one model: no change to measure a target's selectivity by
    p.add_argument("--baseline", default=None, metavar="REPORT",
                   help="with --until: the JSON report of the starting model (an eval of the same set, or a run's "
                        "moral_probe_<name>_baseline.json); the change since it is measured, over the vignettes both "
                        "asked, and with --until change the probe stops once it is known")


def check_out_dir(out: Path) -> None:
    """Fail before minutes of scoring, not after: the report's folder must exist (made here) and be writable."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LoadError(f"cannot create the output folder {out}: {e.strerror}") from None
    if not os.access(out, os.W_OK):
        raise LoadError(f"the output folder {out} is not writable; pass a writable folder with --out")


def read_baseline(path: str, config) -> dict:
    """The baseline record of ``--baseline REPORT`` (before any weights load); refused without ``--until``."""
    from ..rundir.report import load_report
    from ..stats.metrics import as_baseline

    if config.until is None:
        raise ConfigError("--baseline goes with --until: a fixed probe's change is `tinymcf compare BASELINE REPORT`")
    return as_baseline(load_report(path))


def tokenizer_of(args, served: bool):
    """``--tokenizer`` when given (a folder of the model alone has none), else ``--model``'s own, with the option named
    when it has none (with ``--endpoint``, ``--model`` is the served name)."""
    if args.tokenizer:
        return load_tokenizer(args.tokenizer, alone=True)
    try:
        return load_tokenizer(args.model, None if served else args.gguf_file, alone=served)
    except LoadError as e:
        hint = ("with --endpoint, --model is the served name: give the model's tokenizer with --tokenizer PATH"
                if served else "a model saved without its tokenizer takes one with --tokenizer PATH (the tokenizer "
                "it was trained with, e.g. the base model's)")
        raise LoadError(f"{e}; {hint}") from None


def run(args) -> int:
    import torch

    from ..benchmark.runner import Benchmark
    from ..benchmark.text import benchmark_lines
    from ..probe import make_probe
    from ..rundir.report import write_report
    from ..served import ServedModel
    from ..views.text import format_table, sanity_lines

    config = probe_config(args)
    served = served_config(args, config)  # built once, checked once
    bench_config = benchmark_config(args, config)
    if bench_config is not None and served is not None:
        raise ConfigError("--prefs and --lm-eval score a model loaded here: they do not go with --endpoint")
    baseline = read_baseline(args.baseline, config) if args.baseline else None
    out_dir = Path(args.out or ".")
    check_out_dir(out_dir if args.json is None else Path(args.json).parent)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.gguf_file:
        require("gguf")
    tok = tokenizer_of(args, served is not None)
    probe = make_probe(tok, config=config)  # bad data fail before the weights
    bench = Benchmark(tok, bench_config) if bench_config is not None else None  # the pairs too
    if baseline is not None:
        probe.check_baseline(baseline)  # before the server is asked anything, or the weights load
    if served is not None:
        reference = load_model(served.reference, device="cpu", dtype="float32") if served.reference else None
        model = ServedModel(config=served, reference=reference)
    else:
        model = load_model(args.model, device=device, dtype=args.dtype, gguf_file=args.gguf_file)
    report = probe.run(model, progress=not args.no_progress, baseline=baseline)
    print("\n".join(sanity_lines(report)))
    print(format_table(report["table"]))
    extra = {}
    if bench is not None:
        extra = bench.run(model, progress=not args.no_progress)
        print("\n".join(benchmark_lines(extra)))
        extra = {k: v for k, v in extra.items() if v is not None}
    tag = args.tag or Path(str(args.model).rstrip("/")).name or "model"
    safe_tag = "".join(c if c.isalnum() or c in "-_." else "_" for c in tag)
    fmt = "" if config.answer_format == DEFAULT_ANSWER_FORMAT else f"_{config.answer_format}"
    path = Path(args.json) if args.json else out_dir / f"eval_{config.name}{fmt}_{safe_tag}.json"
    try:
        write_report(path, report, tag=tag, model=str(args.model), **extra)
    except OSError as e:
        raise LoadError(f"cannot write {path}: {e.strerror}") from None
    print(f"[tinymcf] report written to {path}")
    return 0
