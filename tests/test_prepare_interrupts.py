"""The key never leaks, and a killed or interrupted ``prepare`` loses nothing: a rerun asks only for the rest."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from helpers.fake_llm_server import FakeLLM
from helpers.prepare import KEY, MY_ROWS, cache_lines, my_csv, write_csv

from tinymcf_callback.apiclient import scrub
from tinymcf_callback.cli.main import main
from tinymcf_callback.data.sets import md5

pytestmark = pytest.mark.usefixtures("clean_env")
ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- the key, kills, resume

SUBPROCESS_ENV = {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}


def _run(args, env, cwd, timeout=120):
    return subprocess.run([sys.executable, "-m", "tinymcf_callback.prepare", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_key_never_leaks(tmp_path, clean_env, capfd, monkeypatch):
    home = Path(os.environ["TINYMCF_HOME"])
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    codes = []

    def run(command, *argv):
        codes.append(main([command, *map(str, argv)]))

    with FakeLLM(KEY) as server:
        src = my_csv(tmp_path)
        api = ["--base-url", server.base_url, "--backoff", "0.01", "--no-progress", "--limit", "2"]
        args = ["--name", "myset", "--source", src, *api]
        run("prepare", *args, "--model", "rulebreak-model", "--attempts", "1")  # failures, with reasons
        run("validate", "--name", "myset", *api, "--model", "good-model")  # rewrites still missing
        run("prepare", *args, "--model", "good-model")
        run("validate", "--name", "myset", *api, "--model", "good-model")
    with FakeLLM("sk-other-key-456") as server:  # the server echoes the wrong key it got in its 401 message
        run("prepare", "--name", "other", "--source", my_csv(tmp_path, MY_ROWS[2:], "b.csv"), "--base-url",
            server.base_url,
            "--model", "good-model", "--no-progress")
    out, err = capfd.readouterr()
    assert codes == [1, 2, 0, 0, 2], out + err
    assert "rejected the API key" in err and "Incorrect API key provided: ***" in err
    assert KEY not in out and KEY not in err
    written = [f for f in [*tmp_path.rglob("*"), *home.rglob("*")] if f.is_file()]
    assert any(f.name == "judgements.jsonl" for f in written) and any(f.name.startswith("validate_") for f in written)
    for f in written:
        assert KEY.encode() not in f.read_bytes(), f
    assert scrub(f"x {KEY} y", [KEY]) == "x *** y"


def test_key_never_leaks_from_a_crash(tmp_path, capfd, monkeypatch):
    """Even an unexpected exception (a bug) that carries the key prints a scrubbed traceback."""
    import tinymcf_callback.prepare.pipeline as prep

    monkeypatch.setenv("OPENROUTER_API_KEY", KEY)

    def boom(*a, **k):
        raise RuntimeError(f"bug with {KEY} inside")

    monkeypatch.setattr(prep, "run_prepare", boom)
    assert main(["prepare", "--name", "x"]) == 1
    out, err = capfd.readouterr()
    assert "RuntimeError: bug with *** inside" in err and KEY not in out + err


@pytest.mark.slow
def test_killed_run_resumes_without_loss_or_duplicates(tmp_path, clean_env):
    rows = [(f"You see a person number {i} breaking a promise to a friend.", "Loyalty", "2") for i in range(16)]
    src = write_csv(tmp_path / "many.csv", rows)
    home = tmp_path / "home"
    cache = home / "cache"
    env = {**os.environ, **SUBPROCESS_ENV, "OPENAI_API_KEY": KEY}
    with FakeLLM(KEY) as server:
        args = ["--name", "many", "--source", src, "--home", home, "--base-url", server.base_url,
                "--model", "good-model", "--concurrency", "2", "--no-progress"]
        server.delay = 0.1
        proc = subprocess.Popen([sys.executable, "-m", "tinymcf_callback.prepare", *map(str, args)], cwd=clean_env,
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        while time.time() < deadline and len(cache_lines(cache / "many.jsonl")) < 6:
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        saved = cache_lines(cache / "many.jsonl")
        assert 6 <= len(saved) < 48, "the run was not killed mid-way"
        server.delay = 0
        before = server.count()
        done = _run(args, env, clean_env)
        assert done.returncode == 0, done.stderr
        assert f"{48 - len(saved)} done" in done.stdout
        assert server.count() - before == 48 - len(saved)
    keys = Counter((e["source_md5"], e["condition"]) for e in cache_lines(cache / "many.jsonl"))
    assert len(keys) == 48 and set(keys.values()) == {1}
    assert keys.keys() == {(md5(t), c) for t, _, _ in rows for c in ("other_uphold", "self_violate", "self_uphold")}


# ``python -m tinymcf_callback.prepare ARGS`` with Ctrl-C meaning what it means in a terminal. A process started
# with SIGINT ignored (any command run in the background, e.g. ``make test &``) passes that on, and Python then
# never raises KeyboardInterrupt; this restores it first.
PREPARE_WITH_CTRL_C = ("import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
                       "runpy.run_module('tinymcf_callback.prepare', run_name='__main__', alter_sys=True)")


@pytest.mark.slow
def test_ctrl_c_stops_at_once_and_the_rerun_resumes(tmp_path, clean_env):
    """A real SIGINT while both workers wait out a 25 s ``Retry-After``: exit 130 at once, every answer kept."""
    rows = [(f"You see a person number {i} breaking a promise to a friend.", "Loyalty", "2") for i in range(16)]
    src = write_csv(tmp_path / "many.csv", rows)
    cache = tmp_path / "home" / "cache" / "many.jsonl"
    env = {**os.environ, **SUBPROCESS_ENV, "OPENAI_API_KEY": KEY}
    with FakeLLM(KEY) as server:
        args = ["--name", "many", "--source", src, "--home", tmp_path / "home", "--base-url", server.base_url,
                "--model", "good-model", "--concurrency", "2", "--no-progress"]
        server.delay = 0.05
        proc = subprocess.Popen([sys.executable, "-c", PREPARE_WITH_CTRL_C, *map(str, args)], cwd=clean_env,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 60
        while time.time() < deadline and len(cache_lines(cache)) < 6:
            time.sleep(0.02)
        server.retry_after = "25"
        server.faults.extend(["429"] * 100)
        while time.time() < deadline and server.count(status=429) < 2:  # both workers are now waiting
            time.sleep(0.02)
        assert server.count(status=429) == 2, "the workers never reached their back-off wait"
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            pytest.fail("prepare was still waiting out its back-off 15 s after Ctrl-C")
        stopped_after = time.monotonic() - start
        assert proc.returncode == 130, err
        assert stopped_after < 8, f"Ctrl-C took {stopped_after:.1f} s"
        assert "Traceback" not in err and "Rerun the same command" in err
        saved = cache_lines(cache)
        assert 6 <= len(saved) < 48 and len(saved) == server.count(status=200)  # every answer received is saved
        assert f"interrupted: {len(saved)} new rewrites saved" in out
        server.faults.clear()
        server.retry_after, server.delay = "0", 0.0
        before = server.count()
        done = _run(args, env, clean_env)
        assert done.returncode == 0, done.stderr
        assert server.count() - before == 48 - len(saved) and f"{48 - len(saved)} done" in done.stdout
    keys = Counter((e["source_md5"], e["condition"]) for e in cache_lines(cache))
    assert len(keys) == 48 and set(keys.values()) == {1}
