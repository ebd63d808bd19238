#!/usr/bin/env python
"""Fine-tune Qwen3-0.6B on a GPU and follow its moral-foundations alignment in Weights & Biases.

The recipe of ``examples/demo.py`` (its everyday moral judgements, the probe's own prompt
format, loss on the answer only) on a GPU model, with the metrics sent to W&B
(``report_to=["wandb"]``) and two probe sets when available: ``scifi`` (bundled) and
``clifford`` (132 vignettes with human wrongness ratings; skipped, with a message, until
``tinymcf prepare --name clifford`` has been run once).

    pip install -e ".[wandb]"                          # from a checkout
    pip install trl                                    # only for --trainer trl
    wandb login                                        # or: export WANDB_MODE=offline
    python examples/wandb_qwen3_gpu.py                 # transformers.Trainer
    python examples/wandb_qwen3_gpu.py --trainer trl   # the same run through TRL's SFTTrainer

In W&B the probe's curves are under ``eval/moral_scifi/`` and ``eval/moral_clifford/``
(score, gap, social_norms, yn_mass, frame_agreement, per-foundation align_other, ...),
plotted against ``train/global_step``, with a per-foundation table at every probe.
Unlike the demo, this script needs the Hugging Face Hub (to download the model) and a
CUDA GPU; ``--cpu`` runs the same code on the CPU, for checking it with a small model.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for _p in (str(HERE.parent), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import demo  # noqa: E402  the demo's data helpers: load_situations, contrast_sets, encode, Collator, ...


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="Qwen/Qwen3-0.6B", help="Hub id or local folder (default Qwen/Qwen3-0.6B)")
    p.add_argument("--trainer", choices=("hf", "trl"), default="hf",
                   help="hf: transformers.Trainer (default); trl: TRL's SFTTrainer")
    p.add_argument("--output-dir", default="runs/qwen3_wandb")
    p.add_argument("--project", default="tinymcf", help="W&B project (the WANDB_PROJECT variable wins)")
    p.add_argument("--run-name", default=None)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--eval-every", type=int, default=20, help="evaluate, save and probe every N steps")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--batch-size", type=int, default=4,
                   help="contrast pairs per batch (x4 sequences); for --trainer trl: 4x this many sequences")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cpu", action="store_true", help="run on the CPU (slow; to check the script with a small model)")
    return p.parse_args(argv)


def probe_callbacks():
    """The scifi probe, plus the clifford probe when that set has been prepared on this machine."""
    from tinymcf_callback import MoralProbeCallback
    from tinymcf_callback.errors import ProbeDataError

    probes = [MoralProbeCallback(name="scifi")]
    try:
        probes.append(MoralProbeCallback(name="clifford"))
    except ProbeDataError as e:
        print(f"[example] not probing clifford: {e}")
    return probes


def prompt_completion_dataset(tok, pairs):
    """The demo's situations as TRL's standard prompt-completion rows, in the probe's prompt format.

    The prompt is the full chat-template text ending in the ``"Answer:"`` pre-fill; the
    completion is the answer token (SFTTrainer appends EOS and, for prompt-completion
    data, puts the loss on the completion only).
    """
    from datasets import Dataset

    from tinymcf_callback.scoring.prompts import FRAMES, format_prompt

    rows = [{"prompt": format_prompt(tok, row["situation"], question),
             "completion": " " + demo.answer_for(row["wrong"], frame)}
            for pair in pairs for row in pair for frame, question in FRAMES.items()]
    return Dataset.from_list(rows)


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("WANDB_PROJECT", args.project)  # read by transformers' WandbCallback

    if args.trainer == "trl":
        try:
            from trl import SFTConfig, SFTTrainer
        except ImportError:
            print("--trainer trl needs TRL: pip install trl", file=sys.stderr)
            return 2

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

    if not args.cpu and not torch.cuda.is_available():
        print("this example needs a CUDA GPU (or --cpu with a small model); for CPU see examples/demo.py",
              file=sys.stderr)
        return 2

    probes = probe_callbacks()  # before the download: a broken set fails here, not after it
    tok = AutoTokenizer.from_pretrained(args.model)
    # fp32 master weights; on the GPU the forward and backward passes run in bf16 autocast (bf16=True)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    train_pairs, eval_pairs = demo.contrast_sets(demo.load_situations(), args.seed)

    common = dict(
        output_dir=args.output_dir,
        run_name=args.run_name,
        max_steps=args.steps,
        learning_rate=args.lr,
        lr_scheduler_type="cosine",
        warmup_steps=max(1, args.steps // 10),
        weight_decay=0.0,
        logging_steps=5,
        eval_strategy="steps",
        eval_steps=args.eval_every,
        save_strategy="steps",
        save_steps=args.eval_every,
        save_total_limit=2,
        save_only_model=True,
        report_to=["wandb"],
        bf16=not args.cpu,
        use_cpu=args.cpu,
        seed=args.seed,
    )
    if args.trainer == "hf":
        trainer = Trainer(
            model=model,
            args=TrainingArguments(**common, per_device_train_batch_size=args.batch_size,
                                   per_device_eval_batch_size=len(eval_pairs), remove_unused_columns=False),
            train_dataset=demo.encode(tok, train_pairs),
            eval_dataset=demo.encode(tok, eval_pairs),
            data_collator=demo.Collator(tok.pad_token_id),
            processing_class=tok,
        )
    else:
        trainer = SFTTrainer(
            model=model,
            args=SFTConfig(**common, per_device_train_batch_size=4 * args.batch_size,
                           per_device_eval_batch_size=4 * len(eval_pairs), completion_only_loss=True, max_length=512),
            train_dataset=prompt_completion_dataset(tok, train_pairs),
            eval_dataset=prompt_completion_dataset(tok, eval_pairs),
            processing_class=tok,
        )
    for probe in probes:
        trainer.add_callback(probe)

    histories = {p.name: Path(args.output_dir) / f"moral_probe_{p.name}.jsonl" for p in probes}
    already = {name: len(demo.read_history(path)) for name, path in histories.items()}  # earlier runs' lines
    trainer.train()

    eval_by_step = {e["step"]: e for e in trainer.state.log_history if "eval_loss" in e}
    for name, path in histories.items():
        print(f"\n[example] moral probe {name!r} per checkpoint (per-foundation columns: align_other)")
        print(demo.summary_table(demo.read_history(path)[already[name]:], eval_by_step))
    try:
        import wandb

        if wandb.run is not None:
            print(f"[example] W&B run: {wandb.run.url or wandb.run.dir}")
            wandb.finish()
    except ImportError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
