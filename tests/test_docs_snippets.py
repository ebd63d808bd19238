"""The docs pages' snippets run as written: each page's code blocks in order, after the setup that
docs/index.md gives ("Running the snippets"), in a fresh folder, offline.

Left out, each for a reason the page shows: command synopses (``[--option ...]``), the callback's signature, the
``tinymcf prepare`` commands for your own set (an LLM API and its key), the commands that run an example
script from a clone (``python examples/steering.py``: minutes, to reproduce a page's table), the demo page's excerpt of
``examples/demo.py`` (the demo itself runs in tests/test_demo.py), and the plot page's figures of runs named
there (``runs/seed0`` ...).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tinymcf_callback.data.home import folders

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = ("index.md", "python.md", "callback.md", "steering.md", "watch.md", "preparing.md", "benchmark.md")
NOT_RUN = {"cli.md": "synopses and figures of runs named on the page", "demo.md": "an excerpt of examples/demo.py",
           "validity.md": "synopses of examples/validity.py",
           "measurements.md": "the GPU benchmark on a lent GPU machine with its wheels (tests/test_gpu_bench.py runs "
                              "its --small dry run)",
           "dashboards.md": "the commands that open a dashboard's server (tests/dashboards/ starts TensorBoard's; "
                            "tests/test_dashboards.py reads each store those servers show)",
           "served.md": "an inference server to ask (tests/test_served.py makes the same calls of a test server, "
                        "tests/servers/ of real vLLM and llama.cpp servers)",
           "rl.md": "an inference server and RL trainers' runs (tests/test_rl.py, tests/test_layouts.py and "
                    "tests/servers/ run the same; its GRPO example is callback.md's, which runs)",
           "development.md": "the shape of a layout record (tests/test_layouts.py registers one of the same shape, "
                             "finds, reads and scores its saves)"}
DRIVER = r"""
import json, subprocess, sys
blocks = json.loads(open(sys.argv[1]).read())
namespace = {"__name__": "__main__"}
for n, (lang, code) in enumerate(blocks):
    print(f"--- block {n + 1} ({lang})", flush=True)
    if lang == "python":
        exec(compile(code, f"<block {n + 1}>", "exec"), namespace)
    else:
        subprocess.run(["bash", "-e", "-c", code], check=True)
"""


def blocks_of(page: str) -> list[tuple[str, str]]:
    """The page's python and bash blocks in order, without synopses and signatures."""
    text = (DOCS / page).read_text(encoding="utf-8")
    found = re.findall(r"^```(python|bash)\n(.*?)^```", text, flags=re.S | re.M)
    keep = []
    for lang, code in found:
        if "[--" in code or code.lstrip().startswith("MoralProbeCallback(name="):  # a synopsis, a signature
            continue
        if page == "preparing.md" and lang == "bash":  # preparing your own set asks an LLM API (a key)
            continue
        if lang == "bash" and code.lstrip().startswith("python examples/"):  # an example script, from a clone
            continue
        keep.append((lang, code))
    return keep


def setup_block() -> str:
    section = (DOCS / "index.md").read_text(encoding="utf-8").split("## Running the snippets", 1)[1]
    return re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)


def test_every_page_with_code_is_run_or_says_why_not():
    pages = {p.name for p in DOCS.glob("*.md") if re.search(r"^```(python|bash)\n", p.read_text(), flags=re.M)}
    assert pages == set(PAGES) | set(NOT_RUN), pages
    assert all(blocks_of(page) for page in PAGES)


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_the_pages_snippets_run_as_written(page, tmp_path, generated_clifford):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    if page == "preparing.md":  # the page's python follows "tinymcf prepare --name clifford" (the download)
        generated_clifford.install_rewrites(folders().cache)  # the shipped cache covers the real texts only
        subprocess.run([sys.executable, "-m", "tinymcf_callback", "prepare", "--name", "clifford", "--source",
                        str(generated_clifford.path), "--allow-checksum-change", "--no-progress"], env=env,
                       check=True, capture_output=True, cwd=tmp_path)
    blocks = [("python", setup_block())] + [b for b in blocks_of(page) if b[1] != setup_block()]
    (tmp_path / "blocks.json").write_text(json.dumps(blocks))
    (tmp_path / "driver.py").write_text(DRIVER)
    p = subprocess.run([sys.executable, "driver.py", "blocks.json"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=1200)
    assert p.returncode == 0, f"{page}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    assert p.stdout.count("--- block") == len(blocks)
