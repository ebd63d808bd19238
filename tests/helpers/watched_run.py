"""A small Trainer run for the watcher's tests: ``python watched_run.py OUT INIT {watch|callback} [GATE]``.

``watch``: the callback hands every probe off (``hand_off=True``), the Trainer saves every step and keeps only
two checkpoints (``save_total_limit=2``); ``callback``: the same run probed in-process at every save (the
reference). With GATE, the training waits after step 3 until that file exists (the test kills and restarts
the watcher meanwhile, so the restart surely comes while the run goes on). The starting weights are read
from INIT (saved there first when absent), so the watcher can score them as step 0. Reports to TensorBoard
and to an offline wandb run (``WANDB_DIR``), or to the reporters ``WATCHED_REPORT_TO`` names (comma-separated; a
trackio run in project ``WATCHED_TRACKIO_PROJECT``).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402

from helpers.trainer_utils import make_trainer, tiny_model  # noqa: E402
from tinymcf_callback import MoralProbeCallback, testing  # noqa: E402

PROBE = {"name": "scifi", "per_foundation": 1, "n_resamples": 0}
MAX_STEPS = 6


class Gate(TrainerCallback):
    """Wait after step ``at`` until ``path`` exists (at most 10 minutes); steps of ``seconds`` each."""

    def __init__(self, path: str | None, at: int = 3, seconds: float = 0.5):
        self.path, self.at, self.seconds = path, at, seconds

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.seconds if self.path else 0.0)
        deadline = time.monotonic() + 600
        while self.path and state.global_step == self.at and not Path(self.path).exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.path} never came")
            time.sleep(0.1)


def main(out: str, init: str, mode: str, gate: str | None = None) -> None:
    tok = AutoTokenizer.from_pretrained(testing.qwen3_tokenizer_dir())
    if not (Path(init) / "config.json").exists():
        tiny_model(0).save_pretrained(init)
        tok.save_pretrained(init)
    model = AutoModelForCausalLM.from_pretrained(init).train()  # its config names INIT: step 0's source
    trainer = make_trainer(out, tok, [Gate(gate)], max_steps=MAX_STEPS, save_steps=1, eval=False, model=model,
                           save_total_limit=2 if mode == "watch" else None,
                           report_to=os.environ.get("WATCHED_REPORT_TO", "tensorboard,wandb").split(","),
                           project=os.environ.get("WATCHED_TRACKIO_PROJECT", "huggingface"))
    trainer.add_callback(MoralProbeCallback(**PROBE, hand_off=mode == "watch", events=("save",), verbose=False,
                                            trainer=trainer))
    trainer.train()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None)
