#!/usr/bin/env python
"""The README's demo: watch the moral-foundations probe move while a real model trains.

Fine-tunes SmolLM2-135M-Instruct (fp32, CPU, no Hub) with ``transformers.Trainer`` on a
small hand-written set of everyday moral judgements (``examples/demo_data.jsonl``),
with ``MoralProbeCallback(name="scifi")`` attached. The callback scores the model on the
probe's own science-fiction vignettes -- which the training data never contains -- at
step 0 and at every evaluation/save, and logs the results to TensorBoard, to
``state.log_history`` and to ``<output-dir>/moral_probe_scifi.jsonl``. At the end the
demo prints one row per probed checkpoint, read back from that history file, and draws
the curves to ``<output-dir>/moral_probe_scifi.png`` (``tinymcf_callback.figures.plot``; without
matplotlib, the ``[plot]`` extra, it says how to install it and skips the figure).

Training examples use the probe's prompt format exactly: the user turn is the situation
plus one of the two Yes/No questions (``prompts.FRAMES``), the assistant turn is
pre-filled with ``"Answer:"`` and the target is the single answer token (`` Yes`` or
`` No``). Only that token carries loss. Every batch item is a contrast pair -- a violation
and an upholding act of the same foundation, each asked both ways -- so its answers are
two Yes and two No: no yes-bias and no question-only rule can fit the data.

    python examples/demo.py                         # the default run (~3.5 min on 2 idle CPU cores)
    python examples/demo.py --quick                 # smoke run (< 1 min), used by the tests
    python examples/demo.py --limit 16              # faster probes: first 16 vignettes (Care, Fairness)
    python examples/demo.py --answer-format json    # probe with JSON true/false answers (training stays Yes/No)

``--answer-format json`` changes only what the probe asks (``{"is_wrong": true|false}``, P(true)); the
training data, and so the fine-tune, are the same: the probe never changes the run it watches.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (str(ROOT), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

DATA_FILE = HERE / "demo_data.jsonl"
MARKER = "demo_run.json"  # written into the output folder; lets a re-run clear its own previous outputs
HISTORY = "moral_probe_scifi.jsonl"
REAL = ("Care", "Fairness", "Loyalty", "Authority", "Sanctity", "Liberty")
SHORT = {"Care": "care", "Fairness": "fair", "Loyalty": "loyal", "Authority": "auth", "Sanctity": "sanct",
         "Liberty": "liberty"}

# Defaults of the full run and of --quick; chosen by measurement (README, demo section: "Settings, and why").
DEFAULTS = {"steps": 50, "eval_every": 10, "limit": 0, "lr": 5e-5, "batch_size": 2}
QUICK = {"steps": 2, "eval_every": 1, "limit": 2, "lr": 5e-5, "batch_size": 1}


# ---- data -----------------------------------------------------------------------------
def load_situations(path: Path = DATA_FILE) -> list[dict]:
    """The demo's training situations: one JSON object a line with id, foundation, wrong, situation."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            missing = {"id", "foundation", "wrong", "situation"} - set(row)
            if missing or not isinstance(row["wrong"], bool):
                raise ValueError(f"{path}:{lineno}: needs id, foundation, situation and a boolean 'wrong'")
            rows.append(row)
    return rows


def contrast_sets(rows: list[dict], seed: int) -> tuple[list[tuple[dict, dict]], list[tuple[dict, dict]]]:
    """Pair every violation with an upholding act of the same foundation; hold out one pair per foundation.

    Returns ``(train, held_out)`` lists of ``(violation, upholding)`` pairs, matched at random
    (seeded) within each foundation.
    """
    rng = random.Random(seed)
    train, held = [], []
    for foundation in dict.fromkeys(r["foundation"] for r in rows):
        bad = [r for r in rows if r["foundation"] == foundation and r["wrong"]]
        good = [r for r in rows if r["foundation"] == foundation and not r["wrong"]]
        if len(bad) != len(good) or len(bad) < 2:
            raise ValueError(f"{foundation}: the demo data needs as many acceptable as wrong situations (>= 2 each), "
                             f"found {len(bad)} wrong and {len(good)} acceptable")
        rng.shuffle(bad)
        rng.shuffle(good)
        pairs = list(zip(bad, good, strict=True))
        held.append(pairs[0])
        train.extend(pairs[1:])
    return train, held


def answer_for(wrong: bool, frame: str) -> str:
    """What a careful person answers: "wrong?" -> Yes iff wrong; "acceptable?" -> Yes iff not wrong."""
    return "Yes" if wrong == (frame == "wrong") else "No"


def encode(tok, pairs: list[tuple[dict, dict]]) -> list[dict]:
    """One item per contrast pair: both situations under both questions, four sequences.

    Prompts are the probe's own (``format_prompt``: chat template, ``"Answer:"`` pre-fill),
    the target is the answer token that follows, and only that token carries loss. Each
    item answers Yes twice and No twice, and each question once Yes and once No: neither a
    Yes/No bias nor a question-only rule lowers the loss, only reading the situation does.
    """
    from tinymcf_callback.scoring.prompts import FRAMES, format_prompt

    items = []
    for pair in pairs:
        seqs = []
        for row in pair:
            for frame, question in FRAMES.items():
                prompt = tok(format_prompt(tok, row["situation"], question), add_special_tokens=False)["input_ids"]
                answer = tok(" " + answer_for(row["wrong"], frame), add_special_tokens=False)["input_ids"]
                seqs.append({"input_ids": prompt + answer, "labels": [-100] * len(prompt) + answer})
        items.append({"seqs": seqs})
    return items


class Collator:
    """Flattens a batch of contrast pairs into their 4 x n sequences and right-pads them.

    Padding is masked out of attention and loss.
    """

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, items: list[dict]) -> dict:
        import torch

        batch = [ex for item in items for ex in item["seqs"]]
        width = max(len(ex["input_ids"]) for ex in batch)
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, ex in enumerate(batch):
            n = len(ex["input_ids"])
            ids[i, :n] = torch.tensor(ex["input_ids"])
            labels[i, :n] = torch.tensor(ex["labels"])
            mask[i, :n] = 1
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def answer_argmax(logits, labels):
    """Keep only the argmax token per position: eval then needs no [batch, seq, vocab] tensor."""
    return logits.argmax(dim=-1)


def answer_accuracy(pred):
    """Share of held-out answers whose token is the model's top-1 next token."""
    preds, labels = pred.predictions, pred.label_ids
    hit = preds[:, :-1] == labels[:, 1:]  # the logits at position t predict the token at t + 1
    scored = labels[:, 1:] != -100
    return {"answer_accuracy": float(hit[scored].mean()) if scored.any() else float("nan")}


def progress_printer(tag: str = "demo"):
    """A TrainerCallback printing one short line per train/eval log (the probe prints its own report)."""
    from transformers import TrainerCallback

    class ProgressLines(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if not state.is_world_process_zero or not logs:
                return
            if "loss" in logs:
                print(f"[{tag}] step {state.global_step:3d}  train loss {logs['loss']:.3f}  "
                      f"grad norm {logs.get('grad_norm', float('nan')):.2f}  lr {logs.get('learning_rate', 0):.1e}")
            if "eval_loss" in logs:
                print(f"[{tag}] step {state.global_step:3d}  held-out loss {logs['eval_loss']:.3f}  "
                      f"answer accuracy {logs.get('eval_answer_accuracy', float('nan')):.2f}")

    return ProgressLines()


# ---- output folder ------------------------------------------------------------------------
def prepare_output_dir(out: Path, also: tuple[str, ...] = ()) -> None:
    """Create ``out``; clear a previous demo run there; refuse a non-empty folder the demo did not make.

    ``also``: more names a caller writes into the folder (cleared with the demo's own outputs).
    """
    if out.exists() and not out.is_dir():
        raise SystemExit(f"demo: --output-dir {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()):
        if not (out / MARKER).exists():
            raise SystemExit(f"demo: {out} is not empty and holds no earlier demo run ({MARKER}); "
                             "choose another --output-dir")
        print(f"[demo] clearing the previous demo run in {out}")
        for child in out.iterdir():
            ours = child.name.startswith(("checkpoint-", "moral_probe_scifi"))  # history, figure, baseline report
            if ours or child.name in ("runs", MARKER, *also):
                shutil.rmtree(child) if child.is_dir() else child.unlink()
    out.mkdir(parents=True, exist_ok=True)


# ---- the summary table ------------------------------------------------------------------
def read_history(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _fmt(x, spec: str = "+.3f") -> str:
    return "n/a" if x is None else format(x, spec)


def summary_table(history: list[dict], eval_by_step: dict[int, dict]) -> str:
    """One row per probe: headline figures, sanity figures, held-out eval and per-foundation align_other."""
    present = [f for f in REAL if any(r["foundation"] == f for h in history for r in h["table"])]
    json_answers = any(h.get("answer_format") == "json" for h in history)
    head = ["step", "score", "gap", "sn_ctrl", "tf_mass" if json_answers else "yn_mass", "frame_agr", "ev_loss",
            "ev_acc"]
    head += [SHORT[f] for f in present]
    rows = [head]
    for h in history:
        ev = eval_by_step.get(h["step"], {})
        by_f = {r["foundation"]: r["align_other"] for r in h["table"]}
        rows.append([str(h["step"]), _fmt(h["score"]), _fmt(h["gap"]), _fmt(h["sn"]),
                     _fmt(h["info"]["yn_mass_mean"], ".3f"), _fmt(h["info"]["frame_agreement"]),
                     _fmt(ev.get("eval_loss"), ".3f"), _fmt(ev.get("eval_answer_accuracy"), ".2f")]
                    + [_fmt(by_f.get(f)) for f in present])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


# ---- one training run with the probe attached (examples/validity.py runs it three times) ------------
def offline_environment() -> None:
    """No Hub, no tokenizer threads. Set when a run starts, not at import: wandb_qwen3_gpu.py imports this
    module and needs the Hub."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


def training_arguments(args: argparse.Namespace, out: Path, n_eval: int):
    """The demo's recipe as ``TrainingArguments`` (README, demo section: "Settings, and why")."""
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(out),
        max_steps=args.steps,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=n_eval,
        learning_rate=args.lr,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=min(5, args.steps // 4),
        weight_decay=0.0,
        logging_steps=max(1, args.eval_every // 2),
        eval_strategy="steps",
        eval_steps=args.eval_every,
        save_strategy="steps",
        save_steps=args.eval_every,
        save_total_limit=1,
        save_only_model=True,  # no optimizer state: 0.5 GB per checkpoint instead of 1.6 GB
        report_to=["tensorboard"],  # logs under <output-dir>/runs/<date>_<host>/
        use_cpu=True,
        seed=args.seed,
        data_seed=args.seed,
        dataloader_num_workers=0,
        remove_unused_columns=False,  # the items are {"seqs": [...]}; the collator unpacks them
        disable_tqdm=True,
    )


@dataclass
class Run:
    """A training run ready to start: the Trainer with the probe attached, and what its summary needs."""

    args: argparse.Namespace
    out: Path
    tag: str  # the prefix of its printed lines
    history: Path  # the probe's history file (moral_probe_scifi.jsonl; moral_probe_scifi_json.jsonl for JSON answers)
    trainer: Any
    probe: Any  # the MoralProbeCallback
    n_probed: int  # vignettes per probe
    t_start: float
    t_loaded: float


@dataclass
class Result:
    """What a finished run logged: the probe history, the held-out evaluations, and where the time went."""

    history: list[dict]
    eval_by_step: dict[int, dict]
    tensorboard: list[str]
    wall_s: float
    load_s: float
    probe_s: float


def prepare_run(args: argparse.Namespace, out: Path, pairs=None, *, tag: str = "demo", meta: dict | None = None,
                answer_format: str = "yesno") -> Run:
    """Load SmolLM2-135M-Instruct (seeded), encode the contrast pairs, build the Trainer with the probe attached.

    ``pairs``: ``(train, held_out)`` contrast pairs; default the demo's own (``contrast_sets`` of
    ``demo_data.jsonl`` with ``args.seed``). ``meta`` is recorded in ``<out>/demo_run.json`` with the args.
    ``answer_format``: the probe's (``"yesno"`` or ``"json"``); the training examples are Yes/No either way.
    """
    t_start = time.perf_counter()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, Trainer, set_seed

    from tinymcf_callback import MoralProbeCallback
    from tinymcf_callback import testing as offline_assets
    from tinymcf_callback.data.sets import load_vignettes
    from tinymcf_callback.rundir.history import history_path

    set_seed(args.seed)
    model_dir = offline_assets.smollm2_dir()
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)  # fp32 for CPU training
    t_loaded = time.perf_counter()

    train_pairs, eval_pairs = pairs if pairs is not None else contrast_sets(load_situations(), args.seed)
    train_ds, eval_ds = encode(tok, train_pairs), encode(tok, eval_pairs)
    limit = args.limit or None
    per_foundation = getattr(args, "per_foundation", 0) or None
    probed = load_vignettes("scifi", limit=limit, per_foundation=per_foundation)
    foundations = list(dict.fromkeys(v["foundation_coarse"] for v in probed))
    print(f"[{tag}] SmolLM2-135M-Instruct fp32 on CPU, loaded in {t_loaded - t_start:.1f}s from {model_dir}")
    print(f"[{tag}] training on {4 * len(train_ds)} examples ({2 * len(train_ds)} situations x 2 questions, "
          f"{4 * args.batch_size} a batch); held out {4 * len(eval_ds)} ({2 * len(eval_ds)} situations) "
          "for eval_loss / answer_accuracy")
    print(f"[{tag}] probe: scifi, {len(probed)} of 51 vignettes ({_subset(limit, per_foundation)}: "
          f"{', '.join(foundations)}), {len(probed) * 8} prompts, {answer_format} answers, at step 0 and every "
          f"{args.eval_every} steps")

    trainer = Trainer(model=model, args=training_arguments(args, out, len(eval_ds)), train_dataset=train_ds,
                      eval_dataset=eval_ds, data_collator=Collator(tok.pad_token_id), processing_class=tok,
                      compute_metrics=answer_accuracy, preprocess_logits_for_metrics=answer_argmax)
    trainer.remove_callback(PrinterCallback)  # it prints every log dict, the probe's 30 metrics included
    trainer.add_callback(progress_printer(tag))
    probe = MoralProbeCallback(name="scifi", limit=limit, per_foundation=per_foundation, trainer=trainer,
                               answer_format=answer_format)
    trainer.add_callback(probe)
    (out / MARKER).write_text(json.dumps({"args": vars(args), **(meta or {}),
                                          "started": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=2) + "\n",
                              encoding="utf-8")
    return Run(args, out, tag, Path(history_path(str(out), "scifi", answer_format)), trainer, probe, len(probed),
               t_start, t_loaded)


def train(run: Run) -> Result:
    """Train; then read the probe history back from ``run.history`` (``<out>/moral_probe_scifi.jsonl``)."""
    run.trainer.train()
    t_end = time.perf_counter()
    history = read_history(run.history)
    return Result(
        history=history,
        eval_by_step={e["step"]: e for e in run.trainer.state.log_history if "eval_loss" in e},
        tensorboard=sorted({cb.logging_dir for cb in run.trainer.callback_handler.callbacks
                            if type(cb).__name__ == "TensorBoardCallback" and getattr(cb, "logging_dir", None)}),
        wall_s=t_end - run.t_start, load_s=run.t_loaded - run.t_start,
        probe_s=sum(h["info"]["elapsed_s"] or 0.0 for h in history))


def print_summary(run: Run, result: Result) -> None:
    """The per-checkpoint table and the wall time."""
    from tinymcf_callback.stats.metrics import probe_key

    tag = run.tag
    print()
    print(f"[{tag}] moral probe (scifi, {run.n_probed} vignettes) per checkpoint; per-foundation columns are "
          f"align_other;\n[{tag}] sn_ctrl = Social Norms control (odd but harmless acts; near 0 unless the model "
          "condemns mere oddness), frame_agr = agreement of the two questions (+1 best)")
    print(summary_table(result.history, result.eval_by_step))
    print(f"[{tag}] wall time {result.wall_s:.0f}s: load {result.load_s:.0f}s, "
          f"train+eval+probes {result.wall_s - result.load_s:.0f}s, of which {len(result.history)} probes "
          f"{result.probe_s:.0f}s")
    print(f"[{tag}] probe history: {run.history}")
    for d in result.tensorboard:
        print(f"[{tag}] TensorBoard logs: {d}")
    key = probe_key("scifi", run.probe.answer_format)
    print(f"[{tag}] view them: tensorboard --logdir {run.out / 'runs'}  (curves under eval/moral_{key}/)")


def write_summary(run: Run, result: Result, meta: dict | None = None) -> dict:
    """``<out>/demo_run.json``: the args, the timings and one entry per probed checkpoint."""
    h_all, ev = result.history, result.eval_by_step
    summary = {"args": vars(run.args), **(meta or {}), "wall_s": round(result.wall_s, 1),
               "load_s": round(result.load_s, 1), "probe_s": round(result.probe_s, 1),
               "tensorboard": result.tensorboard,
               "checkpoints": [{"step": h["step"], "score": h["score"], "gap": h["gap"], "sn": h["sn"],
                                "yn_mass": h["info"]["yn_mass_mean"], "frame_agreement": h["info"]["frame_agreement"],
                                "eval_loss": ev.get(h["step"], {}).get("eval_loss"),
                                "eval_answer_accuracy": ev.get(h["step"], {}).get("eval_answer_accuracy"),
                                "align_other": {r["foundation"]: r["align_other"] for r in h["table"]}}
                               for h in h_all]}
    (run.out / MARKER).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


def draw_curves(out: Path, tag: str = "demo", history: Path | None = None) -> Path | None:
    """Draw the run's curves next to its history (``<out>/moral_probe_scifi.png``); without matplotlib, say how
    to get it and go on."""
    from tinymcf_callback.errors import HistoryError, MissingExtraError
    from tinymcf_callback.figures.plot import plot_histories

    history = history or out / HISTORY
    target = history.with_suffix(".png")
    try:
        plot_histories([history], out=target)
    except MissingExtraError as e:
        print(f"[{tag}] no figure drawn: {e}; then: tinymcf plot {history}")
        return None
    except HistoryError as e:
        print(f"[{tag}] no figure drawn: {e}")
        return None
    print(f"[{tag}] curves: {target}")
    return target


# ---- main -------------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output-dir", default=str(ROOT / "runs" / "demo"),
                   help="where checkpoints, TensorBoard logs, the probe history and its figure go (default: runs/demo)")
    p.add_argument("--answer-format", choices=("yesno", "json"), default="yesno",
                   help="how the probe asks (default yesno; json: {\"is_wrong\": true|false}, P(true)); the "
                        "training data stay Yes/No")
    add_recipe_args(p)
    return finish_args(p, p.parse_args(argv))


def _subset(limit: int | None, per_foundation: int | None) -> str:
    if per_foundation:
        return f"--per-foundation {per_foundation}"
    return "all" if limit is None else f"--limit {limit}"


def add_recipe_args(p: argparse.ArgumentParser) -> None:
    """The recipe's options (shared with examples/validity.py)."""
    def default(key: str) -> str:
        return f"(default {DEFAULTS[key]}; --quick {QUICK[key]})"

    p.add_argument("--steps", type=int, help=f"optimizer steps {default('steps')}")
    p.add_argument("--eval-every", type=int, help=f"evaluate, save and probe every N steps {default('eval_every')}")
    p.add_argument("--limit", type=int, help=f"probe the first N scifi vignettes, 0 = all 51 {default('limit')}")
    p.add_argument("--per-foundation", type=int, default=0,
                   help="probe N scifi vignettes of each of the 7 foundations instead (the balanced subset that keeps "
                        "the Social Norms control; 0 = off, the default; not with --limit)")
    p.add_argument("--lr", type=float, help=f"learning rate {default('lr')}")
    p.add_argument("--batch-size", type=int, help=f"contrast pairs per batch, 4 sequences each {default('batch_size')}")
    p.add_argument("--seed", type=int, default=0, help="seed of the split, the data order and the model (default 0)")
    p.add_argument("--quick", action="store_true", help="a much shorter smoke run (< 1 min): the tests use it")


def finish_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Fill the recipe's unset options from DEFAULTS (or QUICK) and check them."""
    base = QUICK if args.quick else DEFAULTS
    for key, value in base.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.per_foundation:
        args.limit = 0 if args.limit == QUICK["limit"] and args.quick else args.limit  # --quick's limit gives way
    if args.steps <= 0 or args.eval_every <= 0 or args.batch_size <= 0 or args.limit < 0 or args.lr <= 0 \
            or args.per_foundation < 0:
        p.error("--steps, --eval-every, --batch-size and --lr must be positive; --limit and --per-foundation must "
                "be >= 0")
    if args.limit and args.per_foundation:
        p.error("--limit and --per-foundation both choose the probed vignettes: give one")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    offline_environment()
    out = Path(args.output_dir).resolve()
    prepare_output_dir(out)
    run = prepare_run(args, out, answer_format=args.answer_format)
    result = train(run)
    print_summary(run, result)
    write_summary(run, result)
    draw_curves(out, history=run.history)
    if len(result.history) < 2:
        print("[demo] WARNING: fewer than two probes were recorded; see the warnings above", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
