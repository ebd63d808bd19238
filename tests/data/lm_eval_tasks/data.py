"""The sample task's data: ethics_cm_sample.jsonl, the file beside this one (lm-eval's custom_dataset hook)."""

from pathlib import Path

HERE = Path(__file__).resolve().parent


def load(**kwargs):
    import datasets

    return datasets.load_dataset("json", data_files={"test": str(HERE / "ethics_cm_sample.jsonl")})
