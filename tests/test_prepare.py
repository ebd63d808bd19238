"""``python -m tinymcf_callback.prepare`` and ``--validate``: Clifford-shaped data (a generated file on every
machine, the real CSV where present), a real local download server, and a real OpenAI-compatible fake LLM
server driven through the ``openai`` client."""

from __future__ import annotations

import csv
import hashlib
import http.server
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from cli_checks import one_error_line
from fake_llm_server import FakeLLM

from tinymcf_callback import evaluate, load_vignettes, rules
from tinymcf_callback._io import read_jsonl
from tinymcf_callback.home import folders
from tinymcf_callback.llm import Answer, ChatClient, ItemFailed, find_api_key, parse_json_answer, read_dotenv, scrub
from tinymcf_callback.prepare import PrepareError, main, normalize_clifford, read_user_source, rewrite_messages
from tinymcf_callback.sets import RewriteCache, md5, registry, shipped_dir

ROOT = Path(__file__).resolve().parents[1]
KEY = "sk-test-SECRET-123"
CLIFFORD_SHA = "b69a0589517a7b1cc7ab1d8a5034721f468c172d888d765bc81d4dc5e920f0c1"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    """No real key, no .env from the checkout, no cache override; run in an empty folder."""
    for var in ("OPENROUTER_API_KEY", "OPENAI_API_KEY", "TINYMCF_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


@pytest.fixture
def llm(monkeypatch):
    with FakeLLM(KEY) as server:
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        yield server


def cli(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def api(server, model="good-model", *extra):
    return ["--base-url", server.base_url, "--model", model, "--backoff", "0.01", "--timeout", "5",
            "--no-progress", *extra]


def write_csv(path: Path, rows, header=("Scenario", "Foundation", "Wrong")) -> Path:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    path.write_text(buf.getvalue(), encoding="utf-8")
    return path


MY_ROWS = [
    ("You see a man kicking a stray dog in the park.", "Care (p, a)", "3.2"),
    ("You see a girl cheating at cards against her grandmother.", "Fairness", "2.5"),
    ("You see a soldier mocking his own unit to a rival army.", "Loyalty", "2.9"),
    ("You see a man eating soup with a fork at a diner.", "Social Norms", "0.3"),
]


def my_csv(tmp_path, rows=MY_ROWS, name="my.csv") -> Path:
    return write_csv(tmp_path / name, rows)


def cache_lines(path: Path) -> list[dict]:
    return [obj for _, obj in read_jsonl(path)] if path.exists() else []


def snapshot(*dirs) -> dict:
    out = {}
    for d in dirs:
        d = Path(d)
        if d.exists():
            for p in d.rglob("*"):
                if p.is_file():
                    out[str(p)] = p.read_bytes()
    return out


# --------------------------------------------------------------------------- the Clifford file
# ``clifford_source`` runs each test on a generated file of the same shape (every machine) and on the
# real CSV (where it is present; see tests/conftest.py and tests/clifford_like.py).


def test_clifford_parse_counts_and_fields(clifford_source):
    rows = normalize_clifford(clifford_source.path.read_bytes(), str(clifford_source.path))
    assert len(rows) == 132 and len({r["id"] for r in rows}) == 132
    coarse = Counter(r["foundation_coarse"] for r in rows)
    assert coarse == {"Care": 32, "Fairness": 17, "Loyalty": 16, "Authority": 17, "Sanctity": 17,
                      "Liberty": 17, "Social Norms": 16}
    fine = Counter(r["foundation"] for r in rows)
    assert (fine["Care (e)"], fine["Care (p, a)"], fine["Care (p, h)"]) == (16, 9, 7)
    first = rows[0]
    assert first["id"] == md5(first["text"]) and first["text"].startswith("You see ")
    assert first["reasons"]["Care"] == pytest.approx(0.83) and first["reasons"]["Not Wrong"] == 0.0
    assert set(first["reasons"]) == {"Care", "Fairness", "Loyalty", "Authority", "Sanctity", "Liberty", "Not Wrong"}
    assert all(0.0 <= r["wrong"] <= 4.0 for r in rows)
    # scenarios are verbatim (the known quirks are kept, not "fixed")
    assert any(not r["text"].rstrip().endswith((".", '"', "!", "?")) for r in rows)
    if clifford_source.expected is not None:  # the generated file: every field, as written
        assert rows == clifford_source.expected


def test_shipped_clifford_rewrites_match_and_pass_rules(clifford_csv):
    """Real file only: the shipped rewrites are keyed by the md5 of the real texts."""
    rows = normalize_clifford(clifford_csv.read_bytes(), str(clifford_csv))
    shipped = cache_lines(shipped_dir("cache") / "clifford.jsonl")
    assert len(shipped) == 396
    cache = RewriteCache([shipped_dir("cache")])
    for r in rows:
        for cond in ("other_uphold", "self_violate", "self_uphold"):
            assert cache.get(r["id"], cond) is not None, (r["id"], cond)
    ids = {r["id"] for r in rows}
    keys = Counter((e["source_md5"], e["condition"]) for e in shipped)
    assert set(k[0] for k in keys) == ids and max(keys.values()) == 1
    bad = [(e["source_md5"], e["condition"], p) for e in shipped
           if (p := rules.rewrite_problems(e["text"], e["condition"]))]
    assert bad == []


def test_prepare_clifford_without_key_then_evaluate(clifford_source, tiny_qwen, qwen_tok, capsys, monkeypatch):
    clifford_source.ready()
    cached = snapshot(folders().cache)
    rc, out, err = cli(capsys, "--name", "clifford", "--source", clifford_source.path, *clifford_source.flags)
    assert rc == 0, err
    assert "nothing to request" in out
    assert (folders().raw / "clifford.csv").read_bytes() == clifford_source.path.read_bytes()
    stored = cache_lines(folders().sets / "clifford.jsonl")
    assert len(stored) == 132 and stored[0]["foundation_coarse"] == "Care" and isinstance(stored[0]["wrong"], float)
    assert not (ROOT / "sets").exists() and snapshot(folders().cache) == cached  # nothing new cached or in the repo

    # A rerun needs neither the network nor --source: the verified raw copy is reused.
    import tinymcf_callback.clifford as clifford

    monkeypatch.setattr(clifford, "download", lambda *a, **k: pytest.fail("must not download again"))
    assert cli(capsys, "--name", "clifford", *clifford_source.flags)[0] == 0

    assert len(load_vignettes("clifford")) == 132  # every rewrite found
    report = evaluate(tiny_qwen, qwen_tok, name="clifford", limit=24, verbose=False)
    assert report["info"]["n_vignettes"] == 24
    assert isinstance(report["info"]["human_corr"], float)


def test_changed_clifford_texts_get_new_rewrites(generated_clifford, capsys, monkeypatch):
    """Texts the shipped cache does not know (an upstream change) need new rewrites: asked of the LLM."""
    src = generated_clifford.path
    rc, out, err = cli(capsys, "--name", "clifford", "--source", src, "--allow-checksum-change", "--limit", "3")
    one_error_line(rc, err, "no API key", "9 of the 9 rewrites of set 'clifford'")
    assert len(cache_lines(folders().sets / "clifford.jsonl")) == 132  # the checked set is stored all the same
    with FakeLLM(KEY) as server:
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        rc, out, err = cli(capsys, "--name", "clifford", "--allow-checksum-change", "--limit", "3", *api(server))
        assert rc == 0, out + err
        assert server.count(kind="rewrite") == 9
    assert len(cache_lines(folders().cache / "clifford.jsonl")) == 9
    vs = load_vignettes("clifford", limit=3)
    assert [v["other_violate"] for v in vs] == [r["Scenario"] for r in generated_clifford.rows[:3]]
    assert vs[0]["wrong"] == 3.4 and vs[0]["self_violate"].startswith("You break the Care rule")


# --------------------------------------------------------------------------- the download


class _Site:
    """A local web server: /vignettes.csv, /short.csv, /nocol.csv, /changed.csv, /page.html; else 404."""

    def __init__(self, files: dict[str, tuple[bytes, str]]):
        files = files

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                if self.path not in files:
                    self.send_error(404, "Not Found")
                    return
                data, ctype = files[self.path]
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def site(clifford_source):
    raw = clifford_source.path.read_bytes()
    text = raw.decode("utf-8")
    lines = text.splitlines(keepends=True)
    rows = list(csv.reader(io.StringIO(text)))
    buf = io.StringIO()
    csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows([r[:-1] for r in rows])
    changed = text.replace('"3.4"\n', '"3.5"\n', 1)
    assert changed != text
    s = _Site({
        "/vignettes.csv": (raw, "text/plain; charset=utf-8"),
        "/short.csv": ("".join(lines[:101]).encode(), "text/plain"),
        "/nocol.csv": (buf.getvalue().encode(), "text/plain"),
        "/changed.csv": (changed.encode(), "text/plain"),
        "/page.html": (b"<!DOCTYPE html><html><body>Sign in</body></html>", "text/html"),
        "/disguised.csv": (b"<!doctype html>\n<html><p>rate limited</p></html>", "text/plain"),
    })
    s.source = clifford_source
    s.changed = changed.encode()
    yield s
    s.close()


def test_download_from_url(site, capsys):
    site.source.ready()
    rc, out, err = cli(capsys, "--name", "clifford", "--url", f"{site.url}/vignettes.csv", *site.source.flags)
    assert rc == 0, err
    assert (folders().raw / "clifford.csv").read_bytes() == site.source.path.read_bytes()
    assert len(load_vignettes("clifford")) == 132


def test_download_uses_configured_url(monkeypatch, capsys, clifford_source):
    import tinymcf_callback.clifford as clifford

    seen = []
    data = clifford_source.path.read_bytes()
    monkeypatch.setattr(clifford, "download", lambda url, timeout: seen.append(url) or data)
    clifford_source.ready()
    assert cli(capsys, "--name", "clifford", *clifford_source.flags)[0] == 0
    spec = json.loads((ROOT / "configs" / "sets.json").read_text())["clifford"]
    assert seen == [spec["url"]] and spec["sha256"] == CLIFFORD_SHA


@pytest.mark.parametrize("path, message", [
    ("/page.html", "HTML"),
    ("/disguised.csv", "HTML"),
    ("/missing.csv", "HTTP 404"),
    ("/short.csv", "100 vignette rows, expected 132"),
    ("/nocol.csv", "missing columns Wrong"),
])
def test_bad_downloads_are_refused(site, capsys, path, message):
    rc, out, err = cli(capsys, "--name", "clifford", "--url", site.url + path)
    one_error_line(rc, err, message)
    assert "--source" in err or path in ("/short.csv", "/nocol.csv")
    assert not folders().sets.exists() and not folders().raw.exists()


def test_unreachable_download(capsys):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    rc, out, err = cli(capsys, "--name", "clifford", "--url", f"http://127.0.0.1:{port}/x.csv", "--timeout", "5")
    one_error_line(rc, err, "download of", "failed", "--source")


def test_checksum_change(site, capsys):
    rc, out, err = cli(capsys, "--name", "clifford", "--url", f"{site.url}/changed.csv")
    actual = hashlib.sha256(site.changed).hexdigest()
    assert actual != CLIFFORD_SHA
    # both digests: the expected one (configs/sets.json) and the file's own
    one_error_line(rc, err, "sha256", f"expected {CLIFFORD_SHA}", f"actual {actual}", "--allow-checksum-change")
    assert not folders().sets.exists()
    site.source.ready()
    rc, out, err = cli(capsys, "--name", "clifford", "--url", f"{site.url}/changed.csv", "--allow-checksum-change")
    assert rc == 0, err
    assert "warning" in out and load_vignettes("clifford")[0]["wrong"] == 3.5


def test_clifford_name_with_wrong_file(tmp_path, capsys):
    rc, out, err = cli(capsys, "--name", "clifford", "--source", my_csv(tmp_path))
    one_error_line(rc, err, "missing columns")


def test_force_download_fetches_the_stored_copy_again(site, monkeypatch, capsys):
    """A verified copy in ``<home>/raw`` is reused; ``--force-download`` fetches the configured URL again."""
    import tinymcf_callback.clifford as clifford

    real_download, fetched = clifford.download, []

    def configured_url_served_here(url, timeout):  # no internet here: the local site answers for the real URL
        fetched.append(url)
        return real_download(f"{site.url}/changed.csv", timeout)

    site.source.ready()
    assert cli(capsys, "--name", "clifford", "--source", site.source.path, *site.source.flags)[0] == 0
    monkeypatch.setattr(clifford, "download", configured_url_served_here)
    assert cli(capsys, "--name", "clifford", *site.source.flags)[0] == 0
    assert fetched == [] and (folders().raw / "clifford.csv").read_bytes() == site.source.path.read_bytes()
    rc, out, err = cli(capsys, "--name", "clifford", "--force-download", "--allow-checksum-change")
    assert rc == 0, err
    assert fetched == [registry()["clifford"]["url"]]
    assert (folders().raw / "clifford.csv").read_bytes() == site.changed  # the new copy replaced the stored one
    assert load_vignettes("clifford")[0]["wrong"] == 3.5


# --------------------------------------------------------------------------- users' own sets


def test_user_set_end_to_end(tmp_path, llm, capsys, tiny_qwen, qwen_tok):
    src = my_csv(tmp_path)
    rc, out, err = cli(capsys, "--name", "myset", "--source", src, *api(llm), "--description", "four of mine")
    assert rc == 0, out + err
    meta = registry()["myset"]
    assert meta["source"] == "user" and meta["human_ratings"] is True and meta["description"] == "four of mine"
    assert meta["created_from"] == str(src.resolve())
    entries = cache_lines(folders().cache / "myset.jsonl")
    assert len(entries) == 12 and all(list(e) == ["source_md5", "condition", "text", "producer", "rules_version"]
                                      for e in entries)
    assert {e["producer"] for e in entries} == {"llm:good-model"}
    assert {e["rules_version"] for e in entries} == {rules.RULES_VERSION}
    assert all(rules.rewrite_problems(e["text"], e["condition"]) == [] for e in entries)
    vs = load_vignettes("myset")
    assert [v["foundation"] for v in vs] == ["Care (p, a)", "Fairness", "Loyalty", "Social Norms"]
    assert vs[0]["wrong"] == 3.2 and vs[0]["self_violate"].startswith("You break")
    # Each request carried the rules and its vignette: the server refuses (400) a request without the
    # original text, its foundation label or the rules, which would have failed the run above.
    asked = [r for r in llm.requests if r["kind"] == "rewrite"]
    assert len(asked) == 12 and llm.count(status=400) == 0
    conditions = ("other_uphold", "self_violate", "self_uphold")
    expected = sorted((t, c) for t, _, _ in MY_ROWS for c in conditions)
    assert sorted((r["text"], r["condition"]) for r in asked) == expected
    label_of = {t: f for t, f, _ in MY_ROWS}
    assert all(r["label"].startswith(label_of[r["text"]]) for r in asked)

    # rerun: nothing is requested again
    rc, out, err = cli(capsys, "--name", "myset", "--source", src, *api(llm))
    assert rc == 0 and "nothing to request" in out and llm.count(kind="rewrite") == 12

    report = evaluate(tiny_qwen, qwen_tok, name="myset", verbose=False)
    assert report["info"]["n_vignettes"] == 4 and isinstance(report["info"]["human_corr"], float)


def test_user_set_from_jsonl(tmp_path, llm, capsys):
    src = tmp_path / "mine.jsonl"
    src.write_text("".join(json.dumps({"text": t, "foundation": f}) + "\n" for t, f, _ in MY_ROWS[:2]))
    rc, out, err = cli(capsys, "--name", "mine", "--source", src, *api(llm), "--concurrency", "1")
    assert rc == 0, err
    assert registry()["mine"]["human_ratings"] is False
    assert "wrong" not in load_vignettes("mine")[0]


@pytest.mark.parametrize("rows, header, message", [
    ([("You see a man kicking a dog.", "Kindness", "1")], None, "row 1 (line 2): unknown foundation label 'Kindness'"),
    ([("You see a man kicking a dog.", "Care", "1"), ("You see x.", "Purity", "1")], None, "row 2 (line 3)"),
    ([("You see a man kicking a dog.", "Care")], ("Scenario", "Label"), "missing column(s) Foundation"),
    ([("You see a man kicking a dog.", "Care", "1"), ("You see y.", "Care", "")], None,
     "row 2 (line 3): no human rating"),
    ([("You see a man kicking a dog.", "Care", "lots")], None, "'lots' is not a number"),
    ([("You see a.", "Care", "1"), ("You see a.", "Care", "1")], None, "the same scenario as"),
    ([], None, "no vignettes"),
])
def test_bad_user_files(tmp_path, capsys, rows, header, message):
    src = write_csv(tmp_path / "bad.csv", rows, header or ("Scenario", "Foundation", "Wrong"))
    rc, out, err = cli(capsys, "--name", "bad", "--source", src)
    one_error_line(rc, err, message, str(src))
    assert "bad" not in registry()


def test_bad_jsonl_names_the_line(tmp_path):
    src = tmp_path / "x.jsonl"
    src.write_text('{"text": "You see a.", "foundation": "Care"}\n{"text": "You see b.", "foundation": "Hope"}\n')
    with pytest.raises(PrepareError, match=r"x\.jsonl: line 2: unknown foundation label 'Hope'"):
        read_user_source(src)


def test_builtin_names_are_protected(tmp_path, capsys):
    rc, out, err = cli(capsys, "--name", "scifi", "--source", my_csv(tmp_path))
    one_error_line(rc, err, "built-in", "--name")
    rc, out, err = cli(capsys, "--name", "nosuchset")
    one_error_line(rc, err, "unknown set 'nosuchset'", "--source")
    rc, out, err = cli(capsys, "--name", "../evil", "--source", my_csv(tmp_path))
    one_error_line(rc, err, "bad set name")
    rc, out, err = cli(capsys, "--name", "myset", "--limit", "0")
    one_error_line(rc, err, "--limit must be a positive integer")
    # the bundled set needs nothing
    rc, out, err = cli(capsys, "--name", "scifi")
    assert rc == 0 and "nothing to request" in out


def test_no_key_is_a_clear_error_and_changes_no_cache(tmp_path, capsys):
    before = snapshot(folders().cache)
    rc, out, err = cli(capsys, "--name", "myset", "--source", my_csv(tmp_path))
    one_error_line(rc, err, "OPENROUTER_API_KEY", "OPENAI_API_KEY", "shipped cache")
    assert snapshot(folders().cache) == before


def test_rejected_key_or_bad_file_leaves_the_home_byte_for_byte(tmp_path, llm, capsys, monkeypatch):
    src = my_csv(tmp_path)
    assert cli(capsys, "--name", "myset", "--source", src, "--limit", "2", *api(llm))[0] == 0  # 6 rewrites cached
    before = snapshot(folders().home, shipped_dir("cache"))
    assert len(cache_lines(folders().cache / "myset.jsonl")) == 6
    monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong-key-000")
    rc, out, err = cli(capsys, "--name", "myset", "--source", src, *api(llm))
    one_error_line(rc, err, "rejected the API key")
    assert llm.count(status=200) == 6 and snapshot(folders().home, shipped_dir("cache")) == before
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    bad = write_csv(tmp_path / "bad.csv", [*MY_ROWS, ("You see a man kicking a dog.", "Kindness", "1")])
    rc, out, err = cli(capsys, "--name", "myset", "--source", bad, *api(llm))
    one_error_line(rc, err, "unknown foundation label 'Kindness'", str(bad))
    assert llm.count(status=200) == 6 and snapshot(folders().home, shipped_dir("cache")) == before


def test_key_from_dotenv(tmp_path, clean_env, capsys, monkeypatch):
    with FakeLLM(KEY) as server:
        (clean_env / ".env").write_text(f"# comment\nexport OPENROUTER_API_KEY='{KEY}'\n")
        assert find_api_key() == (KEY, f"OPENROUTER_API_KEY in {clean_env / '.env'}")
        rc, out, err = cli(capsys, "--name", "myset", "--source", my_csv(tmp_path), "--limit", "1", *api(server))
        assert rc == 0, err


def test_dry_run_needs_no_key_and_writes_nothing(tmp_path, capsys):
    rc, out, err = cli(capsys, "--name", "myset", "--source", my_csv(tmp_path), "--dry-run", "--limit", "2")
    assert rc == 0, err
    assert "would request 6 of the 6 rewrites" in out and out.count("self_uphold") == 2
    assert not folders().home.exists() or not any(folders().home.iterdir())


def test_limit(tmp_path, llm, capsys):
    rc, out, err = cli(capsys, "--name", "myset", "--source", my_csv(tmp_path), "--limit", "2", *api(llm))
    assert rc == 0 and llm.count() == 6 and len(cache_lines(folders().cache / "myset.jsonl")) == 6
    assert len(load_vignettes("myset", limit=2)) == 2
    rc, out, err = cli(capsys, "--name", "myset", *api(llm))  # the rest, from the registered set
    assert rc == 0 and llm.count() == 12


def test_deprecated_cache_dir_is_read_and_copied_into_the_home(tmp_path, llm, capsys):
    """``--cache-dir X`` of earlier versions: what X holds is used, new rewrites go to the home."""
    src = my_csv(tmp_path)
    assert cli(capsys, "--name", "myset", "--source", src, "--limit", "2", *api(llm))[0] == 0
    old = tmp_path / "mycache"  # the old layout: X/<name>.jsonl, made with --cache-dir X
    old.mkdir()
    (folders().cache / "myset.jsonl").rename(old / "myset.jsonl")
    old_bytes = (old / "myset.jsonl").read_bytes()
    rc, out, err = cli(capsys, "--name", "myset", "--source", src, "--cache-dir", old, *api(llm))
    assert rc == 0, out + err
    assert "--cache-dir is deprecated" in out and "copied 6 rewrites" in out
    assert llm.count(kind="rewrite") == 12  # 6 before, the 6 missing now: none asked twice
    assert (old / "myset.jsonl").read_bytes() == old_bytes and [p.name for p in old.iterdir()] == ["myset.jsonl"]
    assert len(cache_lines(folders().cache / "myset.jsonl")) == 12
    assert len(load_vignettes("myset")) == 4  # no variable but the home
    rc, out, err = cli(capsys, "--name", "myset", "--cache-dir", old, "--dry-run")
    assert rc == 0 and "nothing to request" in out and "would copy" not in out and "copied 6" not in out


def test_unwritable_home(tmp_path, llm, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    rc, out, err = cli(capsys, "--name", "myset", "--source", my_csv(tmp_path), "--home", blocker / "home",
                       *api(llm))
    one_error_line(rc, err, "not writable", "--home")
    assert llm.count() == 0
    assert blocker.read_text() == "not a folder"


def test_unknown_model_404(tmp_path, llm, capsys):
    before = snapshot(folders().cache)
    rc, out, err = cli(capsys, "--name", "myset", "--source", my_csv(tmp_path), *api(llm, "no/such-model"))
    one_error_line(rc, err, "'no/such-model'", "404", "--model")
    assert snapshot(folders().cache) == before


def test_rate_limits_and_server_errors_are_retried(tmp_path, llm, capsys):
    llm.faults.extend(["429", "500", "429", "500", "429"])
    rc, out, err = cli(capsys, "--name", "myset", "--source", my_csv(tmp_path), *api(llm), "--concurrency", "2")
    assert rc == 0, out + err
    assert llm.count(status=429) == 3 and llm.count(status=500) == 2 and llm.count(status=200) == 12
    assert len(cache_lines(folders().cache / "myset.jsonl")) == 12


def test_timeouts_are_retried(tmp_path, llm, capsys):
    llm.faults.append("slow")
    llm.slow_seconds = 3
    t0 = time.time()
    rc, out, err = cli(capsys, "--name", "myset", "--source", my_csv(tmp_path), *api(llm), "--limit", "1",
                       "--concurrency", "1", "--timeout", "0.5")
    assert rc == 0, out + err
    assert llm.count() == 4 and time.time() - t0 < 3  # one timed out, then three answers
    assert len(cache_lines(folders().cache / "myset.jsonl")) == 3


def test_exhausted_retries_are_reported_not_cached(tmp_path, llm, capsys):
    llm.faults.extend(["500"] * 3)
    rc, out, err = cli(capsys, "--name", "myset", "--source", my_csv(tmp_path), *api(llm), "--limit", "1",
                       "--concurrency", "1", "--retries", "2")
    assert rc == 1
    assert "2 done, 1 failed" in out and "server error (500), gave up after 3 tries" in out
    assert len(cache_lines(folders().cache / "myset.jsonl")) == 2


@pytest.mark.parametrize("primary", ["refuse-model", "refusal-field", "malformed-model"])
def test_refusals_and_bad_json_go_to_the_fallback(tmp_path, llm, capsys, primary):
    rc, out, err = cli(capsys, "--name", "myset", "--source", my_csv(tmp_path), "--limit", "2",
                       *api(llm, primary, "--fallback-model", "good-model"))
    assert rc == 0, out + err
    assert llm.count(model=primary) == 6 and llm.count(model="good-model") == 6  # no retry of the refuser
    entries = cache_lines(folders().cache / "myset.jsonl")
    assert len(entries) == 6 and {e["producer"] for e in entries} == {"llm:good-model"}


def test_refusal_without_fallback_fails_with_reason(tmp_path, llm, capsys):
    rc, out, err = cli(capsys, "--name", "myset", "--source", my_csv(tmp_path), "--limit", "1",
                       *api(llm, "refuse-model"))
    assert rc == 1 and "3 failed" in out and "refused" in out
    assert not (folders().cache / "myset.jsonl").exists()


def test_rule_breaking_rewrites_are_retried_then_failed(tmp_path, llm, capsys):
    rc, out, err = cli(capsys, "--name", "myset", "--source", my_csv(tmp_path), "--limit", "1",
                       *api(llm, "rulebreak-model", "--attempts", "2"))
    assert rc == 1 and llm.count() == 6  # two attempts for each of three rewrites
    assert "0 done, 3 failed" in out and "more than one sentence" in out and "'thus'" in out
    assert not (folders().cache / "myset.jsonl").exists()  # never cached
    # then with a fallback that follows the rules
    rc, out, err = cli(capsys, "--name", "myset", *api(llm, "rulebreak-model", "--attempts", "2",
                                                       "--fallback-model", "good-model"))
    assert rc == 0 and {e["producer"] for e in cache_lines(folders().cache / "myset.jsonl")} == {"llm:good-model"}


def test_rule_feedback_fixes_the_rewrite(tmp_path, llm, capsys):
    rc, out, err = cli(capsys, "--name", "myset", "--source", my_csv(tmp_path), "--limit", "1",
                       *api(llm, "fixes-on-retry"))
    assert rc == 0 and llm.count() == 6
    assert {e["producer"] for e in cache_lines(folders().cache / "myset.jsonl")} == {"llm:fixes-on-retry"}


# --------------------------------------------------------------------------- the request itself


ROW = {"id": md5(MY_ROWS[0][0]), "text": MY_ROWS[0][0], "foundation": MY_ROWS[0][1]}


def test_the_fake_server_refuses_a_rewrite_request_without_its_vignette_or_rules(llm):
    """The user-set tests rely on this: a request that drops what the rewrite needs fails with a 400."""
    client = ChatClient(llm.base_url, KEY, timeout=5, retries=0)
    good = rewrite_messages(ROW, "self_violate")
    assert client.chat("good-model", good).content  # the real request passes
    system, user = good[0]["content"], good[1]["content"]
    no_original = user.replace(f"Original (other_violate): {ROW['text']}", "Original (other_violate):")
    no_label = user.replace(f"Foundation: {ROW['foundation']}", "Foundation:")
    no_rules = system.replace(f"at most {rules.MAX_WORDS} words", "short")
    for system_text, user_text, lacks in ((system, no_original, "the original text"),
                                          (system, no_label, "its foundation label"),
                                          (no_rules, user, "the rules")):
        messages = [{"role": "system", "content": system_text}, {"role": "user", "content": user_text}]
        with pytest.raises(ItemFailed, match=rf"request rejected \(400: .*rewrite request lacks {lacks}"):
            client.chat("good-model", messages)
    assert llm.count(status=400) == 3


class FakeClock(threading.Event):
    """The client's cancel event used as its clock: records each back-off wait instead of sleeping it."""

    def __init__(self):
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout=None):
        self.waits.append(timeout)
        return self.is_set()


def test_backoff_doubles_up_to_its_cap(llm):
    """``--backoff 1``: waits of 1, 2, 4, 8, 16 s, then the 30 s cap (each jittered down by at most 25%)."""
    clock = FakeClock()
    client = ChatClient(llm.base_url, KEY, timeout=5, retries=8, backoff=1.0, cancel=clock)
    llm.faults.extend(["500"] * 9)
    with pytest.raises(ItemFailed, match="server error \\(500\\), gave up after 9 tries"):
        client.chat("good-model", rewrite_messages(ROW, "self_violate"))
    assert llm.count(status=500) == 9
    nominal = [1, 2, 4, 8, 16, 30, 30, 30]  # uncapped, the last two would be at least 48 and 96 s
    assert len(clock.waits) == len(nominal)
    for wait, expected in zip(clock.waits, nominal, strict=True):
        assert 0.75 * expected <= wait <= expected, (clock.waits, nominal)


@pytest.mark.parametrize("retry_after, lowest, highest", [("7", 7.0, 7.0), ("120", 0.0, 30.0)])
def test_retry_after_is_honoured_within_the_cap(llm, retry_after, lowest, highest):
    """A 429's ``Retry-After`` sets the wait (not the 0.01 s back-off); one beyond the 30 s cap is not obeyed."""
    clock = FakeClock()
    client = ChatClient(llm.base_url, KEY, timeout=5, retries=3, backoff=0.01, cancel=clock)
    llm.retry_after = retry_after
    llm.faults.append("429")
    assert client.chat("good-model", rewrite_messages(ROW, "self_violate")).content
    assert llm.count(status=429) == 1 and llm.count(status=200) == 1
    assert len(clock.waits) == 1 and lowest <= clock.waits[0] <= highest, clock.waits


def test_no_json_mode_sends_no_response_format(tmp_path, llm, capsys):
    src = my_csv(tmp_path)
    rc, out, err = cli(capsys, "--name", "myset", "--source", src, "--limit", "1", *api(llm), "--no-json-mode")
    assert rc == 0, out + err
    assert llm.count() == 3 and llm.count(json_mode=False) == 3
    rc, out, err = cli(capsys, "--name", "myset", "--limit", "2", *api(llm))  # the default asks for JSON mode
    assert rc == 0, out + err
    assert llm.count() == 6 and llm.count(json_mode=True) == 3


def test_an_endpoint_without_json_mode_is_detected_once(tmp_path, llm, capsys):
    """The first request's 400 about ``response_format`` switches JSON mode off; every later one goes without it."""
    llm.json_mode_supported = False
    rc, out, err = cli(capsys, "--name", "myset", "--source", my_csv(tmp_path), "--limit", "2", *api(llm),
                       "--concurrency", "1")
    assert rc == 0, out + err
    assert llm.count(status=400) == 1 and llm.count(status=400, json_mode=True) == 1
    assert llm.count(status=200) == 6 and llm.count(status=200, json_mode=False) == 6
    assert len(cache_lines(folders().cache / "myset.jsonl")) == 6


# --------------------------------------------------------------------------- the key, kills, resume

SUBPROCESS_ENV = {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}


def _run(args, env, cwd, timeout=120):
    return subprocess.run([sys.executable, "-m", "tinymcf_callback.prepare", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_key_never_leaks(tmp_path, clean_env, capfd, monkeypatch):
    home = Path(os.environ["TINYMCF_HOME"])
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    codes = []

    def run(*argv):
        codes.append(main([str(a) for a in argv]))

    with FakeLLM(KEY) as server:
        src = my_csv(tmp_path)
        args = ["--name", "myset", "--source", src, "--base-url", server.base_url, "--backoff", "0.01",
                "--no-progress", "--limit", "2"]
        run(*args, "--model", "rulebreak-model", "--attempts", "1")  # failures, with reasons
        run(*args, "--model", "good-model", "--validate")  # rewrites still missing
        run(*args, "--model", "good-model")
        run(*args, "--model", "good-model", "--validate")
    with FakeLLM("sk-other-key-456") as server:  # the server echoes the wrong key it got in its 401 message
        run("--name", "other", "--source", my_csv(tmp_path, MY_ROWS[2:], "b.csv"), "--base-url", server.base_url,
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
    import tinymcf_callback.prepare as prep

    monkeypatch.setenv("OPENROUTER_API_KEY", KEY)

    def boom(*a, **k):
        raise RuntimeError(f"bug with {KEY} inside")

    monkeypatch.setattr(prep, "run_prepare", boom)
    assert main(["--name", "x"]) == 1
    out, err = capfd.readouterr()
    assert "RuntimeError: bug with *** inside" in err and KEY not in out + err


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


# --------------------------------------------------------------------------- judge validation


def test_validate(tmp_path, llm, capsys):
    assert cli(capsys, "--name", "myset", "--source", my_csv(tmp_path), *api(llm))[0] == 0
    vs = load_vignettes("myset")
    # the judge gets one rewrite wrong in valence and one in foundation
    llm.judge_overrides[vs[1]["self_uphold"]] = {"foundation": "Fairness", "valence": "violate"}
    llm.judge_overrides[vs[0]["other_uphold"]] = {"foundation": "Authority", "valence": "uphold"}
    # the fake judge calls the Loyalty original "Care": a drift of its rewrite is then not the rewrite's fault
    llm.judge_overrides[vs[2]["self_violate"]] = {"foundation": "Sanctity", "valence": "violate"}
    out_path = tmp_path / "val.jsonl"
    rc, out, err = cli(capsys, "--validate", "--name", "myset", "--out", out_path, *api(llm))
    assert rc == 0, err
    recs = cache_lines(out_path)
    assert len(recs) == 16 and {r["condition"] for r in recs} == {"other_violate", "other_uphold", "self_violate",
                                                                  "self_uphold"}
    flagged = {(r["id"], r["condition"]) for r in recs if r["flagged"]}
    assert flagged == {(vs[1]["id"], "self_uphold"), (vs[0]["id"], "other_uphold")}
    assert "foundation confusion" in out and "flagged rewrites: 2" in out and "valence_acc" in out
    judged = cache_lines(folders().cache / "judgements.jsonl")
    assert len(judged) == 16 and judged[0]["judge_model"] == "good-model" and judged[0]["text_md5"] in {
        md5(r["text"]) for r in recs}
    # cached: no new requests; the rewrite cache ignores judgements.jsonl
    n = llm.count(kind="judge")
    from tinymcf_callback.validate import main as validate_main

    assert validate_main(["--name", "myset", "--no-progress", "--base-url", llm.base_url,
                          "--judge-model", "good-model"]) == 0
    assert llm.count(kind="judge") == n and (Path.cwd() / "validate_myset.jsonl").exists()
    assert len(load_vignettes("myset")) == 4


def register_without_rewrites(sets: Path, name: str) -> None:
    """A user set as ``prepare`` registers it (``<home>/sets/<name>.jsonl`` and ``.json``), with no rewrites made."""
    sets.mkdir(parents=True)
    rows = [{"id": md5(t), "foundation": f, "foundation_coarse": f.split(" (")[0], "text": t, "wrong": float(w)}
            for t, f, w in MY_ROWS]
    (sets / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (sets / f"{name}.json").write_text(json.dumps({"description": "test", "source": "user", "human_ratings": True,
                                                   "rows": len(rows), "format": "jsonl"}))


@pytest.mark.parametrize("args, needles", [
    (["--name", "nosuchset"], ("unknown vignette set 'nosuchset'", "--home")),
    (["--name", "scifi", "--limit", "0"], ("--limit must be a positive integer",)),
    (["--name", "scifi", "--judge-model", "good-model"], ("no API key", "OPENAI_API_KEY")),
    (["--name", "myset"], ("has no other_uphold rewrite", "python -m tinymcf_callback.prepare --name myset")),
])
def test_validate_bad_input_exits_2_with_one_error_line(tmp_path, capsys, args, needles):
    from tinymcf_callback.validate import main as validate_main

    home = tmp_path / "home"
    register_without_rewrites(home / "sets", "myset")
    rc = validate_main([*args, "--home", str(home), "--no-progress", "--out", str(tmp_path / "v.jsonl")])
    one_error_line(rc, capsys.readouterr().err, *needles)
    assert not (tmp_path / "v.jsonl").exists()


# --------------------------------------------------------------------------- small parts


def test_parse_json_answer_is_strict():
    assert parse_json_answer(Answer("m", '{"rewrite": "You see a."}'))[0] == {"rewrite": "You see a."}
    assert parse_json_answer(Answer("m", '```json\n{"rewrite": "You see a."}\n```'))[0] == {"rewrite": "You see a."}
    obj, why = parse_json_answer(Answer("m", 'Sure! Here it is: {"rewrite": "You see a."}'))
    assert obj is None and why.startswith("unparseable")
    assert parse_json_answer(Answer("m", "I'm sorry, I can't help with that."))[1].startswith("refused")
    assert parse_json_answer(Answer("m", None, refusal="no"))[1].startswith("refused")
    assert parse_json_answer(Answer("m", "[1, 2]"))[1].startswith("unparseable")
    assert parse_json_answer(Answer("m", ""))[1] == "empty answer"


def test_read_dotenv(tmp_path):
    p = tmp_path / ".env"
    p.write_text('A=1\n# c\nexport B="two words"\nC=x # note\n\nbroken\n')
    assert read_dotenv(p) == {"A": "1", "B": "two words", "C": "x"}
    assert find_api_key({"OPENAI_API_KEY": "k1"}, tmp_path) == ("k1", "$OPENAI_API_KEY")
    assert find_api_key({}, tmp_path) == (None, None)
