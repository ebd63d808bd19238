"""Run by test_distributed.py, alone or under torchrun: a Trainer with the probe, learning rate 0.

With the weights frozen every probe sees the same model, so metrics from any number of
processes must agree with the single-process run. Each rank also records, per probe, which of
the probe's batches it scored (watching the real ``Probe.score``, which it still calls) and how
many forward calls its model received in inference mode (the probe's; training and the
Trainer's evaluation run outside it), so the test can check the split itself, not just its result,
and the forward calls of the self-check, which every rank makes for the same prompts.
"""

import json
import os
import sys
from pathlib import Path

import torch  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from helpers.trainer_utils import make_trainer  # noqa: E402
from tinymcf_callback import MoralProbeCallback  # noqa: E402
from tinymcf_callback import testing as offline_assets  # noqa: E402
from tinymcf_callback.probe import Probe  # noqa: E402
from tinymcf_callback.scoring import selfcheck  # noqa: E402

out = Path(sys.argv[1])
tok = AutoTokenizer.from_pretrained(offline_assets.qwen3_tokenizer_dir())
# A token budget that gives an odd number of batches: one rank then gets a padded share.
budget = next(b for b in range(120, 2000, 10)
              if len(MoralProbeCallback(name="scifi", limit=3, token_budget=b, tokenizer=tok).probe.batches) % 2)
cb = MoralProbeCallback(name="scifi", limit=3, token_budget=budget, tokenizer=tok, verbose=False)
assert len(cb.probe.batches) % 2 == 1, len(cb.probe.batches)  # an odd number: one rank gets a padded share
trainer = make_trainer(out, tok, [cb], max_steps=2, eval_steps=1, save_steps=1, learning_rate=0.0,
                       per_device_train_batch_size=2)

probe_forwards = []  # one entry per forward call of the model made in inference mode
trainer.model.register_forward_pre_hook(lambda *_: probe_forwards.append(1) if torch.is_inference_mode_enabled()
                                        else None)
shares = []  # per probe on this rank: the batch numbers scored, the forward calls seen and counted, the check's calls
real_run_batches, real_score = selfcheck.run_batches, Probe.score


def watched_run_batches(model, encoded, batches, *args, **kwargs):
    before = len(probe_forwards)
    res = real_run_batches(model, encoded, batches, *args, **kwargs)
    numbers = [cb.probe.batches.index(b) for b in batches]
    shares.append({"batches": numbers, "prompts": sorted({int(i) for b in numbers for i in cb.probe.batches[b]}),
                   "forward_calls": len(probe_forwards) - before, "n_forward": res.n_forward})
    return res


def watched_score(self, model, **kwargs):
    before = len(probe_forwards)
    res = real_score(self, model, **kwargs)
    shares[-1]["probe_forward_calls"] = len(probe_forwards) - before  # the share's and the self-check's
    shares[-1]["check"] = res.check
    return res


selfcheck.run_batches, Probe.score = watched_run_batches, watched_score
trainer.train()
rank = int(os.environ.get("RANK", "0"))
(out / f"log_history_rank{rank}.json").write_text(json.dumps({
    "log_history": trainer.state.log_history, "n_batches": len(cb.probe.batches), "n_prompts": len(cb.probe),
    "world": int(os.environ.get("WORLD_SIZE", "1")), "shares": shares,
}))
