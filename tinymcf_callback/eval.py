"""Offline evaluation: ``python -m tinymcf_callback.eval --model PATH_OR_ID --name scifi``.

Loads a causal LM (local folder or Hub id; with HF_HUB_OFFLINE=1 only local), scores it
on a vignette set, prints the sanity lines and the per-foundation table, and writes the
full report as JSON (``eval_<name>_<tag>.json``, ``eval_<name>_json_<tag>.json`` with ``--answer-format json``;
schema in the README) atomically. ``--home DIR`` reads the
prepared sets of that home (the same as ``TINYMCF_HOME=DIR``).

``--run-dir OUT`` instead sweeps every ``checkpoint-*`` folder of a Trainer output directory into
``OUT/moral_probe_<name>.jsonl``, the callback's history (see :mod:`tinymcf_callback.sweep`).
``--compare A.json B.json`` prints the paired change between two reports of the same vignettes
(see :mod:`tinymcf_callback.comparison`); it loads no model.

Every score comes with an interval (``--level``, default 0.95; ``--n-resamples``, default 2000, 0
for none).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ._io import atomic_write_json
from .comparison import DEFAULT_LEVEL, DEFAULT_RESAMPLES  # light (no torch), unlike probe
from .home import HOME_VAR, using_home
from .prompts import ANSWER_FORMATS, DEFAULT_ANSWER_FORMAT
from .sets import ProbeDataError

DEFAULT_NAME = "scifi"

DTYPES = ("auto", "float32", "bfloat16", "float16")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tinymcf_callback.eval", description=__doc__.splitlines()[0])
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", help="local model folder or Hugging Face id: score one model")
    what.add_argument("--run-dir", metavar="OUT", help="a Trainer output directory: score each checkpoint-<step> "
                      "folder not yet in OUT/moral_probe_<name>.jsonl, in step order, and append it there")
    what.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"),
                      help="two JSON reports of the same set and vignettes: print the paired change B - A of every "
                           "metric with its interval and p-value (no model is loaded)")
    p.add_argument("--allow-precision-change", action="store_true", default=None,
                   help="with --compare: compare reports scored in different precisions (a warning instead of an "
                        "error)")
    p.add_argument("--name", default=None, help=f"vignette set (default: {DEFAULT_NAME})")
    p.add_argument("--home", metavar="DIR", default=None,
                   help=f"where prepared sets and their rewrites are read from, as given to prepare --home "
                        f"(default: ${HOME_VAR}, else the platform's user data folder)")
    p.add_argument("--limit", type=int, default=None, help="score only the first N vignettes")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1, mps ... (default: cuda if available; with "
                   "--run-dir under several processes, each process's own, as with a bare --device cuda)")
    p.add_argument("--dtype", default="auto", choices=DTYPES, help="weights dtype (default: the checkpoint's)")
    p.add_argument("--token-budget", type=int, default=None, help="padded tokens per forward call")
    p.add_argument("--answer-format", choices=tuple(ANSWER_FORMATS), default=None,
                   help=f"how the model answers (default: {DEFAULT_ANSWER_FORMAT}): yesno = Yes or No after "
                        '"Answer:"; json = {"is_wrong": true} or {"is_wrong": false}, P(true) read after the '
                        'pre-filled {"is_wrong":')
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--level", type=float, default=DEFAULT_LEVEL,
                   help=f"confidence level of the intervals (default: {DEFAULT_LEVEL})")
    p.add_argument("--n-resamples", type=int, default=DEFAULT_RESAMPLES,
                   help=f"bootstrap resamples per interval (default: {DEFAULT_RESAMPLES}; 0: no intervals, "
                        f"not with --compare)")
    one = p.add_argument_group("one model (--model)")
    one.add_argument("--tag", default=None, help="label for this run, e.g. step_500 (default: the model folder's name)")
    one.add_argument("--out", default=None, help="folder for the JSON report (default: current folder)")
    one.add_argument("--gguf-file", default=None, help="GGUF file inside --model, for GGUF checkpoints")
    sweep = p.add_argument_group("checkpoint sweep (--run-dir)")
    sweep.add_argument("--base-model", metavar="PATH", default=None,
                       help="the model PEFT adapter checkpoints were trained on (needed for adapter-only checkpoints)")
    sweep.add_argument("--tokenizer", metavar="PATH", default=None,
                       help="tokenizer for every checkpoint (default: each checkpoint's own, else --base-model's)")
    return p


ONE_MODEL_ONLY = ("tag", "out", "gguf_file")
SWEEP_ONLY = ("base_model", "tokenizer")
SCORING_ONLY = ("name", "limit", "device", "token_budget", "answer_format")  # options that mean nothing to --compare


def _check_out_dir(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OSError(f"cannot create the output folder {out}: {e.strerror}") from None
    if not os.access(out, os.W_OK):
        raise OSError(f"the output folder {out} is not writable; pass a writable folder with --out")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.home is not None and not args.home.strip():
        print("error: --home needs a folder", file=sys.stderr)
        return 2
    with using_home(args.home):
        return _run(args)


def _option_misuse(args: argparse.Namespace) -> str | None:
    """The options given that do not apply to the chosen mode, as an error message (None if all apply)."""
    if not args.compare and args.allow_precision_change:
        return "--allow-precision-change applies only with --compare"
    if args.compare:
        given = ["--" + k.replace("_", "-") for k in (*SCORING_ONLY, *ONE_MODEL_ONLY, *SWEEP_ONLY)
                 if getattr(args, k) is not None]
        return f"{', '.join(given)} cannot be used with --compare (it reads two finished reports)" if given else None
    wrong, mode = (ONE_MODEL_ONLY, "--model") if args.run_dir else (SWEEP_ONLY, "--run-dir")
    given = ["--" + k.replace("_", "-") for k in wrong if getattr(args, k) is not None]
    if not given:
        return None
    return f"{', '.join(given)} appl{'y' if len(given) > 1 else 'ies'} only with {mode}"


def _interval_misuse(args: argparse.Namespace) -> str | None:
    """``--level`` / ``--n-resamples`` out of range, as an error message (checked before anything loads)."""
    if not 0.0 < args.level < 1.0:
        return f"--level must be between 0 and 1 (e.g. 0.95 for 95% intervals), got {args.level}"
    if args.compare and args.n_resamples < 100:
        return f"--compare needs --n-resamples of at least 100 (default {DEFAULT_RESAMPLES}), got {args.n_resamples}"
    if args.n_resamples != 0 and args.n_resamples < 100:
        return (f"--n-resamples must be at least 100 (default {DEFAULT_RESAMPLES}), or 0 for no intervals, "
                f"got {args.n_resamples}")
    return None


def _run(args: argparse.Namespace) -> int:
    if args.limit is not None and args.limit <= 0:
        print(f"error: --limit must be a positive number of vignettes, got {args.limit}", file=sys.stderr)
        return 2
    misuse = _option_misuse(args) or _interval_misuse(args)
    if misuse:
        print(f"error: {misuse}", file=sys.stderr)
        return 2
    if args.compare:
        return _compare(args)
    args.name = args.name or DEFAULT_NAME
    args.answer_format = args.answer_format or DEFAULT_ANSWER_FORMAT
    if args.run_dir:
        return _sweep(args)
    out_dir = Path(args.out or ".")
    try:
        _check_out_dir(out_dir)  # fail before minutes of scoring, not after
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .probe import Probe, format_table, report_to_json, sanity_lines

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = "auto" if args.dtype == "auto" else getattr(torch, args.dtype)
    load_kw = {"gguf_file": args.gguf_file} if args.gguf_file else {}
    try:
        tok = AutoTokenizer.from_pretrained(args.model, **load_kw)
        probe_kw = {"token_budget": args.token_budget} if args.token_budget else {}
        probe = Probe(tok, args.name, args.limit, level=args.level, n_resamples=args.n_resamples,
                      answer_format=args.answer_format, **probe_kw)  # data errors surface before the model loads
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype, **load_kw).to(device)
        report = probe.run(model, progress=not args.no_progress)
    except (ProbeDataError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    print("\n".join(sanity_lines(report)))
    print(format_table(report["table"]))
    tag = args.tag or Path(str(args.model).rstrip("/")).name or "model"
    safe_tag = "".join(c if c.isalnum() or c in "-_." else "_" for c in tag)
    fmt = "" if args.answer_format == DEFAULT_ANSWER_FORMAT else f"_{args.answer_format}"
    path = out_dir / f"eval_{args.name}{fmt}_{safe_tag}.json"
    payload = report_to_json(report, tag=tag, model=str(args.model))
    try:
        atomic_write_json(path, payload)
    except OSError as e:
        print(f"error: cannot write {path}: {e.strerror}", file=sys.stderr)
        return 2
    print(f"[tinymcf] report written to {path}")
    return 0


def _sweep(args: argparse.Namespace) -> int:
    """``--run-dir``: the checkpoint sweep; exit 2 for bad input, 1 when some checkpoints could not be scored."""
    import torch.distributed as dist
    from transformers.utils import logging as hf_logging

    from .sweep import SweepError, SweepSettings, process_state, run_sweep

    settings = SweepSettings(Path(args.run_dir), args.name, args.limit, base_model=args.base_model,
                             tokenizer=args.tokenizer, device=args.device, dtype=args.dtype,
                             token_budget=args.token_budget, progress=not args.no_progress, level=args.level,
                             n_resamples=args.n_resamples, answer_format=args.answer_format)
    had_group = dist.is_available() and dist.is_initialized()
    state = process_state(args.device)
    hf_logging.disable_progress_bar()  # one bar over the checkpoints, not one per weight file loaded
    try:
        result = run_sweep(settings)
    except SweepError as e:
        if state.is_main_process:
            print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        if not had_group:
            state.destroy_process_group()  # the group this sweep started (torchrun / accelerate launch) ends here
    if not state.is_main_process:
        return 1 if result.failures else 0
    skipped = f", {len(result.skipped)} skipped (already in the history)" if result.skipped else ""
    print(f"[tinymcf] sweep of {settings.run_dir}: {len(result.scored)} checkpoint(s) scored{skipped}, "
          f"{len(result.failures)} failed; history: {result.history}")
    if result.failures:
        print(f"error: {len(result.failures)} checkpoint(s) could not be scored (the others are in the history; "
              f"a rerun retries only these):", file=sys.stderr)
        for o in result.failures:
            print(f"  {o.folder}: {o.error}", file=sys.stderr)
        return 1
    return 0


def _compare(args: argparse.Namespace) -> int:
    """``--compare A B``: the paired change table on stdout; exit 2 with one ``error:`` line for bad input."""
    import warnings

    from .comparison import CompareError, compare, format_comparison, load_report

    labels = tuple(args.compare)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the result carries them; printed with the table
            result = compare(*(load_report(path) for path in args.compare), level=args.level,
                             n_resamples=args.n_resamples, labels=labels,
                             allow_precision_change=bool(args.allow_precision_change))
    except CompareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_comparison(result, labels))
    return 0


if __name__ == "__main__":
    sys.exit(main())
