"""configs/ and cache/ travel in the built wheel: install it in a fresh venv, evaluate from outside."""

import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import os, sys, torch
import tinymcf_callback
assert "site-packages" in tinymcf_callback.__file__, tinymcf_callback.__file__
from tinymcf_callback import evaluate, load_vignettes
from tinymcf_callback.data.sets import shipped_dir
assert "_data" in str(shipped_dir("configs")) and "_data" in str(shipped_dir("cache")), shipped_dir("configs")
assert len(load_vignettes("scifi")) == 51
from tinymcf_callback import testing as offline_assets
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(offline_assets.qwen3_tokenizer_dir())
r = evaluate(offline_assets.tiny_qwen3(), tok, "scifi", limit=2, verbose=False)
print("OK", r["info"]["n_prompts"])
"""


@pytest.mark.slow
def test_wheel_install_and_evaluate(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(ROOT)],
                   check=True, capture_output=True, timeout=300)
    wheel = next(dist.glob("tinymcf_callback-*.whl"))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    py = env_dir / "bin" / "python"
    site = Path(subprocess.check_output([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        text=True).strip())
    # Dependencies come from the project's environment (torch etc. are large); the package itself only from the wheel.
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)]
    subprocess.run(pip, check=True, capture_output=True, timeout=300)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    p = subprocess.run([str(py), "-c", SCRIPT], cwd=work, capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "OK 16" in p.stdout
