"""``tinymcf prepare --name myset --source FILE``: users' own sets, and their rewrites requested from a real
OpenAI-compatible fake LLM server through the ``openai`` client (keys, retries, refusals, rules, JSON mode)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from helpers.cli_checks import one_error_line
from helpers.fake_llm_server import FakeLLM
from helpers.prepare import KEY, MY_ROWS, api, cache_lines, cli, my_csv, snapshot, write_csv

from tinymcf_callback import evaluate, load_vignettes
from tinymcf_callback.data.home import folders
from tinymcf_callback.data.sets import md5, registry, shipped_dir
from tinymcf_callback.errors import PrepareError
from tinymcf_callback.prepare import rules
from tinymcf_callback.prepare.llm import (
    ChatClient,
    ItemFailed,
    find_api_key,
)
from tinymcf_callback.prepare.rewrites import rewrite_messages
from tinymcf_callback.prepare.userset import read_user_source

pytestmark = pytest.mark.usefixtures("clean_env")
ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- users' own sets


def test_user_set_end_to_end(tmp_path, llm, capsys, tiny_qwen, qwen_tok):
    src = my_csv(tmp_path)
    rc, out, err = cli(capsys, "prepare", "--name", "myset", "--source", src, *api(llm), "--description",
                       "four of mine")
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
    rc, out, err = cli(capsys, "prepare", "--name", "myset", "--source", src, *api(llm))
    assert rc == 0 and "nothing to request" in out and llm.count(kind="rewrite") == 12

    report = evaluate(tiny_qwen, qwen_tok, name="myset", verbose=False)
    assert report["info"]["n_vignettes"] == 4 and isinstance(report["info"]["human_corr"], float)


def test_user_set_from_jsonl(tmp_path, llm, capsys):
    src = tmp_path / "mine.jsonl"
    src.write_text("".join(json.dumps({"text": t, "foundation": f}) + "\n" for t, f, _ in MY_ROWS[:2]))
    rc, out, err = cli(capsys, "prepare", "--name", "mine", "--source", src, *api(llm), "--concurrency", "1")
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
    rc, out, err = cli(capsys, "prepare", "--name", "bad", "--source", src)
    one_error_line(rc, err, message, str(src))
    assert "bad" not in registry()


def test_bad_jsonl_names_the_line(tmp_path):
    src = tmp_path / "x.jsonl"
    src.write_text('{"text": "You see a.", "foundation": "Care"}\n{"text": "You see b.", "foundation": "Hope"}\n')
    with pytest.raises(PrepareError, match=r"x\.jsonl: line 2: .*'Hope'"):
        read_user_source(src)


def test_builtin_names_are_protected(tmp_path, capsys):
    rc, out, err = cli(capsys, "prepare", "--name", "scifi", "--source", my_csv(tmp_path))
    one_error_line(rc, err, "built-in", "--name")
    rc, out, err = cli(capsys, "prepare", "--name", "nosuchset")
    one_error_line(rc, err, "unknown set 'nosuchset'", "--source")
    rc, out, err = cli(capsys, "prepare", "--name", "../evil", "--source", my_csv(tmp_path))
    one_error_line(rc, err, "bad set name")
    rc, out, err = cli(capsys, "prepare", "--name", "myset", "--limit", "0")
    one_error_line(rc, err, "--limit must be a positive whole number of vignettes")
    # the bundled set needs nothing
    rc, out, err = cli(capsys, "prepare", "--name", "scifi")
    assert rc == 0 and "nothing to request" in out


def test_no_key_is_a_clear_error_and_changes_no_cache(tmp_path, capsys):
    before = snapshot(folders().cache)
    rc, out, err = cli(capsys, "prepare", "--name", "myset", "--source", my_csv(tmp_path))
    one_error_line(rc, err, "OPENROUTER_API_KEY", "OPENAI_API_KEY", "shipped cache")
    assert snapshot(folders().cache) == before


def test_rejected_key_or_bad_file_leaves_the_home_byte_for_byte(tmp_path, llm, capsys, monkeypatch):
    src = my_csv(tmp_path)
    assert cli(capsys, "prepare", "--name", "myset", "--source", src, "--limit", "2",
               *api(llm))[0] == 0  # 6 rewrites cached
    before = snapshot(folders().home, shipped_dir("cache"))
    assert len(cache_lines(folders().cache / "myset.jsonl")) == 6
    monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong-key-000")
    rc, out, err = cli(capsys, "prepare", "--name", "myset", "--source", src, *api(llm))
    one_error_line(rc, err, "rejected the API key")
    assert llm.count(status=200) == 6 and snapshot(folders().home, shipped_dir("cache")) == before
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    bad = write_csv(tmp_path / "bad.csv", [*MY_ROWS, ("You see a man kicking a dog.", "Kindness", "1")])
    rc, out, err = cli(capsys, "prepare", "--name", "myset", "--source", bad, *api(llm))
    one_error_line(rc, err, "unknown foundation label 'Kindness'", str(bad))
    assert llm.count(status=200) == 6 and snapshot(folders().home, shipped_dir("cache")) == before


def test_key_from_dotenv(tmp_path, clean_env, capsys, monkeypatch):
    with FakeLLM(KEY) as server:
        (clean_env / ".env").write_text(f"# comment\nexport OPENROUTER_API_KEY='{KEY}'\n")
        assert find_api_key() == (KEY, f"OPENROUTER_API_KEY in {clean_env / '.env'}")
        rc, out, err = cli(capsys, "prepare", "--name", "myset", "--source", my_csv(tmp_path), "--limit", "1",
                           *api(server))
        assert rc == 0, err


def test_dry_run_needs_no_key_and_writes_nothing(tmp_path, capsys):
    rc, out, err = cli(capsys, "prepare", "--name", "myset", "--source", my_csv(tmp_path), "--dry-run", "--limit", "2")
    assert rc == 0, err
    assert "would request 6 of the 6 rewrites" in out and out.count("self_uphold") == 2
    assert not folders().home.exists() or not any(folders().home.iterdir())


def test_limit(tmp_path, llm, capsys):
    rc, out, err = cli(capsys, "prepare", "--name", "myset", "--source", my_csv(tmp_path), "--limit", "2", *api(llm))
    assert rc == 0 and llm.count() == 6 and len(cache_lines(folders().cache / "myset.jsonl")) == 6
    assert len(load_vignettes("myset", limit=2)) == 2
    rc, out, err = cli(capsys, "prepare", "--name", "myset", *api(llm))  # the rest, from the registered set
    assert rc == 0 and llm.count() == 12


def test_unwritable_home(tmp_path, llm, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    rc, out, err = cli(capsys, "prepare", "--name", "myset", "--source", my_csv(tmp_path), "--home", blocker / "home",
                       *api(llm))
    one_error_line(rc, err, "not writable", "--home")
    assert llm.count() == 0
    assert blocker.read_text() == "not a folder"


def test_unknown_model_404(tmp_path, llm, capsys):
    before = snapshot(folders().cache)
    rc, out, err = cli(capsys, "prepare", "--name", "myset", "--source", my_csv(tmp_path), *api(llm, "no/such-model"))
    one_error_line(rc, err, "'no/such-model'", "404", "--model")
    assert snapshot(folders().cache) == before


def test_rate_limits_and_server_errors_are_retried(tmp_path, llm, capsys):
    llm.faults.extend(["429", "500", "429", "500", "429"])
    rc, out, err = cli(capsys, "prepare", "--name", "myset", "--source", my_csv(tmp_path), *api(llm),
                       "--concurrency", "2")
    assert rc == 0, out + err
    assert llm.count(status=429) == 3 and llm.count(status=500) == 2 and llm.count(status=200) == 12
    assert len(cache_lines(folders().cache / "myset.jsonl")) == 12


def test_timeouts_are_retried(tmp_path, llm, capsys):
    llm.faults.append("slow")
    llm.slow_seconds = 3
    t0 = time.time()
    rc, out, err = cli(capsys, "prepare", "--name", "myset", "--source", my_csv(tmp_path), *api(llm), "--limit", "1",
                       "--concurrency", "1", "--timeout", "0.5")
    assert rc == 0, out + err
    assert llm.count() == 4 and time.time() - t0 < 3  # one timed out, then three answers
    assert len(cache_lines(folders().cache / "myset.jsonl")) == 3


def test_exhausted_retries_are_reported_not_cached(tmp_path, llm, capsys):
    llm.faults.extend(["500"] * 3)
    rc, out, err = cli(capsys, "prepare", "--name", "myset", "--source", my_csv(tmp_path), *api(llm), "--limit", "1",
                       "--concurrency", "1", "--retries", "2")
    assert rc == 1
    assert "2 done, 1 failed" in out and "(500)" in out and "3 tries" in out
    assert len(cache_lines(folders().cache / "myset.jsonl")) == 2


@pytest.mark.parametrize("primary", ["refuse-model", "refusal-field", "malformed-model"])
def test_refusals_and_bad_json_go_to_the_fallback(tmp_path, llm, capsys, primary):
    rc, out, err = cli(capsys, "prepare", "--name", "myset", "--source", my_csv(tmp_path), "--limit", "2",
                       *api(llm, primary, "--fallback-model", "good-model"))
    assert rc == 0, out + err
    assert llm.count(model=primary) == 6 and llm.count(model="good-model") == 6  # no retry of the refuser
    entries = cache_lines(folders().cache / "myset.jsonl")
    assert len(entries) == 6 and {e["producer"] for e in entries} == {"llm:good-model"}


def test_refusal_without_fallback_fails_with_reason(tmp_path, llm, capsys):
    rc, out, err = cli(capsys, "prepare", "--name", "myset", "--source", my_csv(tmp_path), "--limit", "1",
                       *api(llm, "refuse-model"))
    assert rc == 1 and "3 failed" in out and "refused" in out
    assert not (folders().cache / "myset.jsonl").exists()


def test_rule_breaking_rewrites_are_retried_then_failed(tmp_path, llm, capsys):
    rc, out, err = cli(capsys, "prepare", "--name", "myset", "--source", my_csv(tmp_path), "--limit", "1",
                       *api(llm, "rulebreak-model", "--attempts", "2"))
    assert rc == 1 and llm.count() == 6  # two attempts for each of three rewrites
    assert "0 done, 3 failed" in out and "more than one sentence" in out and "'thus'" in out
    assert not (folders().cache / "myset.jsonl").exists()  # never cached
    # then with a fallback that follows the rules
    rc, out, err = cli(capsys, "prepare", "--name", "myset", *api(llm, "rulebreak-model", "--attempts", "2",
                                                       "--fallback-model", "good-model"))
    assert rc == 0 and {e["producer"] for e in cache_lines(folders().cache / "myset.jsonl")} == {"llm:good-model"}


def test_rule_feedback_fixes_the_rewrite(tmp_path, llm, capsys):
    rc, out, err = cli(capsys, "prepare", "--name", "myset", "--source", my_csv(tmp_path), "--limit", "1",
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
    with pytest.raises(ItemFailed, match="500.*9 tries"):
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
    rc, out, err = cli(capsys, "prepare", "--name", "myset", "--source", src, "--limit", "1", *api(llm),
                       "--no-json-mode")
    assert rc == 0, out + err
    assert llm.count() == 3 and llm.count(json_mode=False) == 3
    rc, out, err = cli(capsys, "prepare", "--name", "myset", "--limit", "2",
                       *api(llm))  # the default asks for JSON mode
    assert rc == 0, out + err
    assert llm.count() == 6 and llm.count(json_mode=True) == 3


def test_an_endpoint_without_json_mode_is_detected_once(tmp_path, llm, capsys):
    """The first request's 400 about ``response_format`` switches JSON mode off; every later one goes without it."""
    llm.json_mode_supported = False
    rc, out, err = cli(capsys, "prepare", "--name", "myset", "--source", my_csv(tmp_path), "--limit", "2", *api(llm),
                       "--concurrency", "1")
    assert rc == 0, out + err
    assert llm.count(status=400) == 1 and llm.count(status=400, json_mode=True) == 1
    assert llm.count(status=200) == 6 and llm.count(status=200, json_mode=False) == 6
    assert len(cache_lines(folders().cache / "myset.jsonl")) == 6
