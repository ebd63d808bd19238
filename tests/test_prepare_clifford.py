"""``tinymcf prepare --name clifford``: the Clifford-shaped file (a generated one on every machine, the real CSV
where present), its shipped rewrites, and a real local download server."""

from __future__ import annotations

import csv
import hashlib
import http.server
import io
import json
import threading
from collections import Counter
from pathlib import Path

import pytest
from helpers.cli_checks import one_error_line
from helpers.fake_llm_server import FakeLLM
from helpers.prepare import CLIFFORD_SHA, KEY, api, cache_lines, cli, my_csv, snapshot

from tinymcf_callback import evaluate, load_vignettes
from tinymcf_callback.data.home import folders
from tinymcf_callback.data.sets import RewriteCache, md5, registry, shipped_dir
from tinymcf_callback.prepare import rules
from tinymcf_callback.prepare.clifford import normalize_clifford

pytestmark = pytest.mark.usefixtures("clean_env")
ROOT = Path(__file__).resolve().parents[1]


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
    rc, out, err = cli(capsys, "prepare", "--name", "clifford", "--source", clifford_source.path,
                       *clifford_source.flags)
    assert rc == 0, err
    assert "nothing to request" in out
    assert (folders().raw / "clifford.csv").read_bytes() == clifford_source.path.read_bytes()
    stored = cache_lines(folders().sets / "clifford.jsonl")
    assert len(stored) == 132 and stored[0]["foundation_coarse"] == "Care" and isinstance(stored[0]["wrong"], float)
    assert not (ROOT / "sets").exists() and snapshot(folders().cache) == cached  # nothing new cached or in the repo

    # A rerun needs neither the network nor --source: the verified raw copy is reused.
    import tinymcf_callback.prepare.clifford as clifford

    monkeypatch.setattr(clifford, "download", lambda *a, **k: pytest.fail("must not download again"))
    assert cli(capsys, "prepare", "--name", "clifford", *clifford_source.flags)[0] == 0

    assert len(load_vignettes("clifford")) == 132  # every rewrite found
    report = evaluate(tiny_qwen, qwen_tok, name="clifford", limit=24, verbose=False)
    assert report["info"]["n_vignettes"] == 24
    assert isinstance(report["info"]["human_corr"], float)


def test_changed_clifford_texts_get_new_rewrites(generated_clifford, capsys, monkeypatch):
    """Texts the shipped cache does not know (an upstream change) need new rewrites: asked of the LLM."""
    src = generated_clifford.path
    rc, out, err = cli(capsys, "prepare", "--name", "clifford", "--source", src, "--allow-checksum-change",
                       "--limit", "3")
    one_error_line(rc, err, "no API key", "9 of the 9 rewrites of set 'clifford'")
    assert len(cache_lines(folders().sets / "clifford.jsonl")) == 132  # the checked set is stored all the same
    with FakeLLM(KEY) as server:
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        rc, out, err = cli(capsys, "prepare", "--name", "clifford", "--allow-checksum-change", "--limit", "3",
                           *api(server))
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
    rc, out, err = cli(capsys, "prepare", "--name", "clifford", "--url", f"{site.url}/vignettes.csv",
                       *site.source.flags)
    assert rc == 0, err
    assert (folders().raw / "clifford.csv").read_bytes() == site.source.path.read_bytes()
    assert len(load_vignettes("clifford")) == 132


def test_download_uses_configured_url(monkeypatch, capsys, clifford_source):
    import tinymcf_callback.prepare.clifford as clifford

    seen = []
    data = clifford_source.path.read_bytes()
    monkeypatch.setattr(clifford, "download", lambda url, timeout: seen.append(url) or data)
    clifford_source.ready()
    assert cli(capsys, "prepare", "--name", "clifford", *clifford_source.flags)[0] == 0
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
    rc, out, err = cli(capsys, "prepare", "--name", "clifford", "--url", site.url + path)
    one_error_line(rc, err, message)
    assert "--source" in err or path in ("/short.csv", "/nocol.csv")
    assert not folders().sets.exists() and not folders().raw.exists()


def test_unreachable_download(capsys):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    rc, out, err = cli(capsys, "prepare", "--name", "clifford", "--url", f"http://127.0.0.1:{port}/x.csv",
                       "--timeout", "5")
    one_error_line(rc, err, "download of", "failed", "--source")


def test_checksum_change(site, capsys):
    rc, out, err = cli(capsys, "prepare", "--name", "clifford", "--url", f"{site.url}/changed.csv")
    actual = hashlib.sha256(site.changed).hexdigest()
    assert actual != CLIFFORD_SHA
    # both digests: the expected one (configs/sets.json) and the file's own
    one_error_line(rc, err, "sha256", f"expected {CLIFFORD_SHA}", f"actual {actual}", "--allow-checksum-change")
    assert not folders().sets.exists()
    site.source.ready()
    rc, out, err = cli(capsys, "prepare", "--name", "clifford", "--url", f"{site.url}/changed.csv",
                       "--allow-checksum-change")
    assert rc == 0, err
    assert "warning" in out and load_vignettes("clifford")[0]["wrong"] == 3.5


def test_clifford_name_with_wrong_file(tmp_path, capsys):
    rc, out, err = cli(capsys, "prepare", "--name", "clifford", "--source", my_csv(tmp_path))
    one_error_line(rc, err, "missing columns")


def test_force_download_fetches_the_stored_copy_again(site, monkeypatch, capsys):
    """A verified copy in ``<home>/raw`` is reused; ``--force-download`` fetches the configured URL again."""
    import tinymcf_callback.prepare.clifford as clifford

    real_download, fetched = clifford.download, []

    def configured_url_served_here(url, timeout):  # no internet here: the local site answers for the real URL
        fetched.append(url)
        return real_download(f"{site.url}/changed.csv", timeout)

    site.source.ready()
    assert cli(capsys, "prepare", "--name", "clifford", "--source", site.source.path, *site.source.flags)[0] == 0
    monkeypatch.setattr(clifford, "download", configured_url_served_here)
    assert cli(capsys, "prepare", "--name", "clifford", *site.source.flags)[0] == 0
    assert fetched == [] and (folders().raw / "clifford.csv").read_bytes() == site.source.path.read_bytes()
    rc, out, err = cli(capsys, "prepare", "--name", "clifford", "--force-download", "--allow-checksum-change")
    assert rc == 0, err
    assert fetched == [registry()["clifford"]["url"]]
    assert (folders().raw / "clifford.csv").read_bytes() == site.changed  # the new copy replaced the stored one
    assert load_vignettes("clifford")[0]["wrong"] == 3.5
