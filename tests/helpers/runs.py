"""Real Trainer runs for the tests that follow a run (sweep, watch, the callback through a run's whole life).

Every run trains the tiny random Qwen3 (mechanics, never moral content) from a starting model saved in a
folder (so the run's record and its adapters name it, as a real run's do), saves a checkpoint at every
step with model weights only (small and quick), and probes ``PROBE`` (two Care vignettes, no intervals):
the callback in-process, or ``hand_off=True`` for a watcher. ``python runs.py OUT INIT KEY=VALUE ...``
runs the same in a process of its own (a training a test kills, or follows while it trains).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

PROBE = {"name": "scifi", "limit": 2, "n_resamples": 0}
PROBE_ARGS = ["--limit", "2", "--n-resamples", "0"]
HISTORY = "moral_probe_scifi.jsonl"
TIMING = ("elapsed_s", "seconds")


def start_model(folder: Path, tok, seed: int = 0) -> Path:
    """The run's starting weights saved in ``folder`` (once), with the tokenizer."""
    from helpers.trainer_utils import tiny_model

    if not (folder / "config.json").exists():
        tiny_model(seed).save_pretrained(folder)
        tok.save_pretrained(folder)
    return folder


def train_run(out: Path, tok, init: Path, *, max_steps: int = 4, hand_off: bool = True, probe: bool = True,
              callbacks=(), resume: str | bool | None = None, learning_rate: float = 1e-3, peft: bool = False,
              answer_formats=("yesno",), seed: int = 0, **kw):
    """Train ``max_steps`` steps from ``init``, a checkpoint at every step; returns the Trainer."""
    from transformers import AutoModelForCausalLM

    from helpers.trainer_utils import make_trainer
    from tinymcf_callback import MoralProbeCallback

    model = AutoModelForCausalLM.from_pretrained(init).train()  # its config names INIT: the run's starting model
    if peft:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    kw.setdefault("per_device_train_batch_size", 2)
    kw.setdefault("save_only_model", resume is None)  # the model only (a test run's optimizer states are most of
    # its bytes); a run a test resumes is made with save_only_model=False and resumed with its optimizer's states
    trainer = make_trainer(out, tok, (), max_steps=max_steps, save_steps=1, eval=False, model=model,
                           learning_rate=learning_rate, seed=seed, **kw)
    if probe:
        for answer_format in answer_formats:
            trainer.add_callback(MoralProbeCallback(**PROBE, answer_format=answer_format, hand_off=hand_off,
                                                    events=("save",), verbose=False, trainer=trainer))
    for callback in callbacks:  # after the probe's: at on_save they see the checkpoint recorded and handed off
        trainer.add_callback(callback)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def clone(run: Path, dst: Path, *, keep_history: bool = True) -> Path:
    """A copy of a run folder (files hard-linked: cheap; a test replaces a file, never edits one in place); its
    histories left out with ``keep_history=False``."""
    def link(src, target):
        try:
            os.link(src, target)
        except OSError:
            shutil.copy2(src, target)

    shutil.copytree(run, dst, copy_function=link, symlinks=True,
                    ignore=None if keep_history else shutil.ignore_patterns("moral_probe_*.jsonl"))
    return dst


def history(run: Path, name: str = HISTORY) -> list[dict]:
    path = run / name
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def steps_events(lines: list[dict]) -> list[tuple[int, str]]:
    return [(line["step"], line["event"]) for line in lines]


# What a self-check record says whatever its budget allowed: which prompts a probe checks depends on how long the
# probes before it took (selfcheck.Rotation), so two writers of the same numbers check other prompts
CHECK_KEPT = ("strategy", "fallbacks", "tolerance", "precision")


def budget_free(value):
    """``value`` with each ``self_check`` record cut to what does not depend on the check's time budget."""
    if isinstance(value, dict):
        return {k: ({c: v[c] for c in CHECK_KEPT if c in v} if k == "self_check" and isinstance(v, dict)
                    else budget_free(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [budget_free(v) for v in value]
    return value


def without(value, apart=("event", "model", "by", *TIMING)):
    """A history line with what legitimately differs between two writers of the same numbers left out."""
    value = budget_free(value)
    if isinstance(value, dict):
        return {k: without(v, apart) for k, v in value.items() if k not in apart and not k.endswith(TIMING)}
    if isinstance(value, list):
        return [without(v, apart) for v in value]
    return value


# Two lines of one checkpoint scored by two processes (the callback's live model, the sweep's model loaded from disk)
# hold float32 P(Yes) summed in another order: equal to ~1e-7 per prompt, and an interval bound (t * bootstrap se)
# carries that up to ~10x. Measured: 1.2e-6 on gap_lo of a LoRA line.
FLOAT32_TOLERANCE = 1e-5


def assert_same_numbers(a, b, where="line", skip=("elapsed_s", "seconds")):
    """Equal structure; numbers within ``FLOAT32_TOLERANCE`` (timings skipped); everything else equal."""
    if isinstance(a, dict):
        outside = {"by", "fingerprint"} if where == "line" else set()  # a swept line says which command wrote it
        assert set(a) - outside == set(b) - outside, where
        for k in set(a) - outside:
            if not any(str(k).endswith(s) for s in skip):
                assert_same_numbers(a[k], b[k], f"{where}.{k}", skip)
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_numbers(x, y, f"{where}[{i}]", skip)
    elif isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool):
        assert (math.isnan(a) and math.isnan(b)) or abs(a - b) <= FLOAT32_TOLERANCE, f"{where}: {a} vs {b}"
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


def same_line(a: dict, b: dict) -> None:
    """Two history lines of one step agree in every number (whatever event wrote them, and whatever the model was
    called: a live model and a checkpoint loaded from its folder have other names)."""
    other = ("event", "model")
    a, b = budget_free(a), budget_free(b)
    assert_same_numbers({k: v for k, v in a.items() if k not in other}, {k: v for k, v in b.items() if k not in other})


def env_for(tmp_path: Path) -> dict:
    return {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_PROJECT": "tinymcf-test",
            "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def wait_for(predicate, timeout: float = 300, every: float = 0.1, what: str = "a condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not come within {timeout} s")
        time.sleep(every)


def main(argv: list[str]) -> None:
    """``python runs.py OUT INIT key=value ...``: ``train_run`` in a process of its own; ``pause_at=N`` sleeps
    ``pause`` seconds after each save from step N on, the save recorded and handed off (a training a test kills
    while it runs)."""
    from transformers import AutoTokenizer, TrainerCallback

    from tinymcf_callback import testing

    out, init, *pairs = argv
    kw = {}
    for pair in pairs:
        key, value = pair.split("=", 1)
        kw[key] = json.loads(value)

    class Pause(TrainerCallback):
        def __init__(self, at: int, seconds: float):
            self.at, self.seconds = at, seconds

        def on_save(self, args, state, control, **kwargs):
            if state.global_step >= self.at:
                time.sleep(self.seconds)

    pause = [Pause(kw.pop("pause_at"), kw.pop("pause", 60.0))] if "pause_at" in kw else []
    tok = AutoTokenizer.from_pretrained(testing.qwen3_tokenizer_dir())
    start_model(Path(init), tok)
    train_run(Path(out), tok, Path(init), callbacks=pause, **kw)


if __name__ == "__main__":
    main(sys.argv[1:])
