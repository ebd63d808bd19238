#!/usr/bin/env python
"""The probe in a training loop of your own: plain PyTorch under accelerate, no Trainer, with ``ProbeLogger``.

The demo's data and labels (``examples/demo.py``: SmolLM2-135M-Instruct, fp32 on the CPU, batches
of contrast pairs, AdamW at 5e-5), written as the loop a researcher writes by hand: ``accelerate``
prepares the model, the optimizer and the data, and every ``--probe-every`` steps
``ProbeLogger.log`` probes the live model (``per_foundation=2``: 14 vignettes, every foundation and
the Social Norms control), appends the history line, measures the change since step 0 and sends the
metrics to the loop's TensorBoard tracker (``Accelerator(log_with="tensorboard")``).

    python examples/custom_loop.py            # 30 steps, probed at 0, 10, 20, 30 (~4 min on 2 idle cores)
    python examples/custom_loop.py --quick    # 2 steps: the mechanics

Writes, under ``--output-dir`` (default ``runs/custom_loop``): the history
``moral_probe_scifi.jsonl`` (draw it with ``tinymcf plot runs/custom_loop``), the baseline's report
``moral_probe_scifi_baseline.json``, and the TensorBoard logs (curves under ``eval/moral_scifi/``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import demo  # noqa: E402 - the demo's data, encoding and offline set-up


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output-dir", default=str(ROOT / "runs" / "custom_loop"))
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--probe-every", type=int, default=10)
    p.add_argument("--quick", action="store_true", help="2 steps, probed at 0 and 2, 1 vignette per foundation")
    args = p.parse_args(argv)
    per_foundation = 2
    if args.quick:
        args.steps, args.probe_every, per_foundation = 2, 2, 1
    demo.offline_environment()

    import torch
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tinymcf_callback import Probe, ProbeLogger
    from tinymcf_callback import testing as offline_assets

    out = Path(args.output_dir).resolve()
    demo.prepare_output_dir(out, also=("custom_loop",))  # a rerun replaces an earlier run of this script
    (out / demo.MARKER).write_text("examples/custom_loop.py\n", encoding="utf-8")
    set_seed(0)
    accelerator = Accelerator(cpu=True, log_with="tensorboard", project_dir=str(out))
    accelerator.init_trackers("custom_loop")
    model_dir = offline_assets.smollm2_dir()
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    train_pairs, _ = demo.contrast_sets(demo.load_situations(), seed=0)
    data = torch.utils.data.DataLoader(demo.encode(tok, train_pairs), batch_size=2, shuffle=True,
                                       collate_fn=demo.Collator(tok.pad_token_id))
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.0)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)

    probe_logger = ProbeLogger(Probe(tok, "scifi", per_foundation=per_foundation), out, to=accelerator)
    t0 = time.perf_counter()
    probe_s = 0.0

    def log(step: int) -> None:
        nonlocal probe_s
        start = time.perf_counter()
        m = probe_logger.log(accelerator.unwrap_model(model), step=step)
        probe_s += time.perf_counter() - start
        change = m.get("eval/moral_scifi/score_change")
        p_value = m.get("eval/moral_scifi/score_change_p")
        shown = "" if change is None or step == 0 else f"  change since step 0 {change:+.3f}" + (
            "" if p_value is None else f" (p {p_value:.3f})")
        print(f"[custom_loop] step {step:3d}: score {m['eval/moral_scifi/score']:+.3f}  control "
              f"{m.get('eval/moral_scifi/social_norms', float('nan')):+.3f}{shown}  "
              f"({time.perf_counter() - start:.1f}s)")

    log(0)
    step = 0
    while step < args.steps:
        for batch in data:
            model.train()
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            accelerator.log({"train/loss": loss.item()}, step=step)
            if step % args.probe_every == 0:
                log(step)
            if step == args.steps:
                break
    accelerator.end_training()
    wall = time.perf_counter() - t0
    print(f"[custom_loop] {args.steps} steps in {wall:.0f}s, of which {probe_s:.0f}s in "
          f"{len(range(0, args.steps + 1, args.probe_every))} probes ({100 * probe_s / wall:.0f}%); history: "
          f"{probe_logger.history}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
