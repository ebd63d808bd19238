"""Run by test_distributed.py, alone or under torchrun: a Trainer with the probe, learning rate 0.

With the weights frozen every probe sees the same model, so metrics from any number of
processes must agree with the single-process run.
"""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import offline_assets  # noqa: E402
from trainer_utils import make_trainer  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from tinymcf_callback import MoralProbeCallback  # noqa: E402

out = Path(sys.argv[1])
tok = AutoTokenizer.from_pretrained(offline_assets.qwen3_tokenizer_dir())
# A token budget that gives an odd number of batches: one rank then gets a padded share.
budget = next(b for b in range(120, 2000, 10)
              if len(MoralProbeCallback(name="scifi", limit=3, token_budget=b, tokenizer=tok).probe.batches) % 2)
cb = MoralProbeCallback(name="scifi", limit=3, token_budget=budget, tokenizer=tok, verbose=False)
assert len(cb.probe.batches) % 2 == 1, len(cb.probe.batches)  # an odd number: one rank gets a padded share
trainer = make_trainer(out, tok, [cb], max_steps=2, eval_steps=1, save_steps=1, learning_rate=0.0,
                       per_device_train_batch_size=2)
trainer.train()
rank = int(os.environ.get("RANK", "0"))
(out / f"log_history_rank{rank}.json").write_text(json.dumps({
    "log_history": trainer.state.log_history, "n_batches": len(cb.probe.batches),
    "world": int(os.environ.get("WORLD_SIZE", "1")),
}))
