"""A real Trainer on the tiny random Qwen3 for the callback tests (mechanics only)."""

from __future__ import annotations

import torch
from transformers import Trainer, TrainingArguments


class TinyLMData(torch.utils.data.Dataset):
    def __init__(self, n: int = 16, seq: int = 12, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, 1000, (n, seq), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i].clone()}


def tiny_model(seed: int = 0, dropout: float = 0.1):
    from tinymcf_callback import testing as offline_assets

    model = offline_assets.tiny_qwen3(seed=seed)
    model.config.attention_dropout = dropout  # randomness during training: probes must not disturb it
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = dropout
    return model.train()


def make_trainer(tmp, tok, callbacks=(), *, max_steps=4, eval_steps=2, save_steps=2, report_to=("none",),
                 eval=True, seed=0, model=None, **kw):
    kw.setdefault("learning_rate", 1e-3)
    kw.setdefault("per_device_train_batch_size", 4)
    kw.setdefault("use_cpu", True)
    kw.setdefault("save_only_model", True)  # a resumed test run passes False: its optimizer's states
    args = TrainingArguments(
        output_dir=str(tmp), max_steps=max_steps, per_device_eval_batch_size=4,
        logging_steps=1, eval_strategy="steps" if eval else "no", eval_steps=eval_steps,
        save_strategy="steps", save_steps=save_steps, report_to=list(report_to), seed=seed,
        disable_tqdm=True, dataloader_num_workers=0, **kw,
    )
    model = tiny_model(seed) if model is None else model
    trainer = Trainer(model=model, args=args, train_dataset=TinyLMData(16, seed=seed),
                      eval_dataset=TinyLMData(4, seed=seed + 1) if eval else None, processing_class=tok)
    for cb in callbacks:
        trainer.add_callback(cb)
    return trainer
