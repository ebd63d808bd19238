"""The lexical-cue rule for upholding rewrites (rules version 2): the rule, the shipped caches, and prepare.

An uphold may not add a word that the VADER lexicon scores <= -1 and its violation lacks,
nor read more negative than its violation below a compound of -0.3. ``prepare`` sends an
answer that breaks it back with the reason, through the real fake OpenAI-compatible server.
"""

from __future__ import annotations

import csv
import json
import sys

import pytest
from helpers.prepare import api, cli

from tinymcf_callback import load_vignettes
from tinymcf_callback._io import read_jsonl
from tinymcf_callback.data.home import folders, shipped_dir
from tinymcf_callback.data.sets import CONDITIONS, md5, read_set_file
from tinymcf_callback.prepare import rules
from tinymcf_callback.prepare.clifford import normalize_clifford

pytestmark = pytest.mark.usefixtures("clean_env")

KEY = "sk-test-LEXICON-1"
ORIGINAL = "You see a starship pilot secretly sending her crew's flight path to the alien fleet hunting them."


def user_csv(tmp_path, rows):
    path = tmp_path / "mine.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["Scenario", "Foundation"])
        w.writerows(rows)
    return path


MY_ROWS = [("You see a soldier mocking his own unit to a rival army.", "Loyalty"),
           ("You see a man kicking a stray dog in the park.", "Care (p, a)")]


# --------------------------------------------------------------------------- the rule


def test_an_uphold_that_adds_a_negative_word_breaks_the_rule():
    text = "You see a starship pilot refusing a large bribe from the alien fleet hunting her crew."
    problems = rules.rewrite_problems(text, "other_uphold", original=ORIGINAL)
    assert any("'refusing' (-1.7)" in p and "lexical cue" in p and "refused" in p for p in problems), problems
    # the same text passes every other rule: without the original (or as a violation) it is clean
    assert rules.rewrite_problems(text, "other_uphold") == []
    assert rules.rewrite_problems(text, "other_violate", original=ORIGINAL) == []


def test_a_plainly_positive_uphold_passes():
    text = "You see a starship pilot plotting a safe flight path that keeps her crew out of reach of the fleet."
    assert rules.rewrite_problems(text, "other_uphold", original=ORIGINAL) == []
    assert rules.rewrite_problems("You plot a safe flight path for your crew.", "self_uphold", original=ORIGINAL) == []


@pytest.mark.parametrize("original,uphold", [
    # the negative word is the situation's, in both texts: allowed
    ("You see a wizard selling his order's spellbook to the rival order sworn to destroy it.",
     "You see a wizard guarding his order's spellbook from the rival order sworn to destroy it."),
    # another regular inflection of the original's word is the same word ("dislikes" / "dislike")
    ("You see a chess club captain leaving a player off the team list only because he dislikes her.",
     "You put a player on your chess club's team list although you dislike her."),
])
def test_negative_words_the_violation_has_are_allowed(original, uphold):
    cond = "self_uphold" if not uphold.startswith("You see") else "other_uphold"
    assert rules.added_cue_words(uphold, original) == {}
    assert rules.rewrite_problems(uphold, cond, original=original) == []


def test_an_uphold_may_not_read_more_negative_than_its_violation():
    """No added word scores <= -1 here (negated positives), yet the sentence reads clearly negative."""
    original = "You see a clerk in a small shop keeping a coin that a customer dropped."
    text = "You see a clerk in a small shop who is not happy and not glad to hand back a coin that a customer dropped."
    assert rules.added_cue_words(text, original) == {}
    problems = rules.rewrite_problems(text, "other_uphold", original=original)
    assert len(problems) == 1 and "reads more negative than the original (sentiment -0.80" in problems[0], problems
    # a situation that reads negative in the violation may read as negative in the uphold
    grim = "You see a clerk in a grim, miserable shop keeping a coin that a customer dropped."
    uphold = "You see a clerk in a grim, miserable shop handing back a coin that a customer dropped."
    assert rules.compound(uphold) < rules.COMPOUND_FLOOR
    assert rules.rewrite_problems(uphold, "other_uphold", original=grim) == []


# Upholds of the rules-1 scifi cache, as shipped before (issue 10): each breaks the rule; the shipped
# replacement, under the same key, passes it.
OLD_UPHOLDS = [
    ("7f83e59a", "other_uphold", "You see a starship pilot refusing a large bribe from the alien fleet hunting her "
                                 "crew to reveal their flight path.", "refusing"),
    ("fac768e5", "self_uphold", "You hold the mountain gate shut at night against goblin raiders attacking your own "
                                "dwarf clan's halls.", "attacking"),
    ("f44214fd", "other_uphold", "You see a time traveller returning the preserved heart of a long-dead saint to its "
                                 "shrine after thieves stole it.", "thieves"),
]


@pytest.mark.parametrize("prefix,condition,old,word", OLD_UPHOLDS)
def test_old_scifi_upholds_break_the_rule_and_their_replacements_pass(prefix, condition, old, word):
    rows = {r["id"][:8]: r for r in read_set_file(shipped_dir("configs") / "scifi.jsonl", "scifi")}
    original = rows[prefix]["text"]
    assert word in rules.added_cue_words(old, original)
    shipped = next(v for v in load_vignettes("scifi") if v["id"].startswith(prefix))[condition]
    assert shipped != old and rules.rewrite_problems(shipped, condition, original=original) == []


# --------------------------------------------------------------------------- the shipped caches


def shipped_entries(name):
    return [obj for _, obj in read_jsonl(shipped_dir("cache") / f"{name}.jsonl")]


def assert_entries_pass(entries, originals):
    bad = [(e["source_md5"][:8], e["condition"], p) for e in entries
           if (p := rules.rewrite_problems(e["text"], e["condition"], original=originals[e["source_md5"]]))]
    assert bad == []
    assert {e["rules_version"] for e in entries} == {rules.RULES_VERSION}


def test_shipped_scifi_rewrites_pass_every_rule_with_their_originals():
    entries = shipped_entries("scifi")
    originals = {r["id"]: r["text"] for r in read_set_file(shipped_dir("configs") / "scifi.jsonl", "scifi")}
    assert len(entries) == 3 * len(originals) == 153
    assert_entries_pass(entries, originals)


def test_shipped_clifford_rewrites_pass_every_rule_with_their_originals(clifford_csv):
    """Real file only (its texts are not shipped): every Clifford rewrite against its original."""
    rows = normalize_clifford(clifford_csv.read_bytes(), str(clifford_csv))
    entries = shipped_entries("clifford")
    assert len(entries) == 396
    assert_entries_pass(entries, {r["id"]: r["text"] for r in rows})


# --------------------------------------------------------------------------- prepare


def test_prepare_sends_a_lexical_cue_back_with_the_reason(tmp_path, llm, capsys):
    src = user_csv(tmp_path, MY_ROWS)
    rc, out, err = cli(capsys, "prepare", "--name", "cues", "--source", src, *api(llm, "cue-until-told"))
    assert rc == 0, out + err
    told = [r for r in llm.requests if r.get("feedback")]
    assert len(told) == 4  # each uphold, once; the violations passed at the first answer
    assert {r["condition"] for r in told} == {"other_uphold", "self_uphold"}
    assert all("'refusing' (-1.7)" in r["feedback"] or "'refuse' (-1.2)" in r["feedback"] for r in told)
    assert all("lexical cue" in r["feedback"] and r["feedback"].startswith("That rewrite breaks these rules")
               for r in told)
    entries = [obj for _, obj in read_jsonl(folders().cache / "cues.jsonl")]
    originals = {md5(t): t for t, _ in MY_ROWS}
    assert len(entries) == 6
    assert_entries_pass(entries, originals)
    assert not any("refus" in e["text"] for e in entries)
    assert "tinymcf show --name cues -n 10" in out  # the spot check, offered after new rewrites


def test_a_rewrite_that_keeps_the_cue_is_never_cached(tmp_path, llm, capsys):
    src = user_csv(tmp_path, MY_ROWS[:1])
    rc, out, err = cli(capsys, "prepare", "--name", "cues", "--source", src, *api(llm, "cue-until-told"),
                       "--attempts", "1")
    assert rc == 1
    assert "other_uphold" in out and "lexical cue" in out and "never cached" in out
    entries = [obj for _, obj in read_jsonl(folders().cache / "cues.jsonl")]
    assert sorted(e["condition"] for e in entries) == ["self_violate"]
    assert "--show" not in out


def test_prepare_without_the_lexicon_stops_before_any_request(tmp_path, llm, capsys, monkeypatch):
    """A setup without vaderSentiment: one clear error, no request sent, nothing written."""
    monkeypatch.setitem(sys.modules, "vaderSentiment", None)  # `import vaderSentiment` now raises ImportError
    monkeypatch.setitem(sys.modules, "vaderSentiment.vaderSentiment", None)
    rules.sentiment_analyzer.cache_clear()
    try:
        rc, out, err = cli(capsys, "prepare", "--name", "cues", "--source", user_csv(tmp_path, MY_ROWS), *api(llm,
                                                                                                              "good-model"))
    finally:
        rules.sentiment_analyzer.cache_clear()
    assert rc == 2 and llm.requests == []
    assert err.startswith("error: the lexical-cue rule that checks every uphold rewrite needs the vaderSentiment "
                          "package, part of the [prepare] extra") and "pip install" in err
    assert "Traceback" not in err and not (folders().cache / "cues.jsonl").exists()


def test_rewrites_of_older_rules_are_kept_and_named(tmp_path, capsys):
    """A home's rules-1 rewrites stay in use (nothing re-requested, nothing refused); prepare names those that
    break today's rules, with the file and line to delete to have them remade."""
    src = user_csv(tmp_path, MY_ROWS[:1])
    rid = md5(MY_ROWS[0][0])
    texts = {"other_uphold": "You see a soldier refusing to mock his own unit to a rival army.",
             "self_violate": "You mock your own unit to a rival army.",
             "self_uphold": "You praise your own unit to a rival army."}
    cache = folders().cache
    cache.mkdir(parents=True)
    (cache / "old.jsonl").write_text("".join(json.dumps({"source_md5": rid, "condition": c, "text": t,
                                                         "producer": "llm:older", "rules_version": 1}) + "\n"
                                             for c, t in texts.items()), encoding="utf-8")
    rc, out, err = cli(capsys, "prepare", "--name", "old", "--source", src, "--base-url", "http://127.0.0.1:9/v1")
    assert rc == 0, out + err
    assert "nothing to request" in out
    assert f"note: 1 cached rewrites of 'old' made under older rules break rules version {rules.RULES_VERSION}" in out
    assert f"old.jsonl:1 {rid} other_uphold: adds negative words" in out and "'refusing'" in out
    vs = load_vignettes("old")
    assert [vs[0][c] for c in CONDITIONS[1:]] == list(texts.values())
