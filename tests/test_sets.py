"""The data layer: the shipped scifi set, the rewrite cache, its lint, and clear errors."""

import json
from collections import Counter

import pytest

from tinymcf_callback import load_vignettes
from tinymcf_callback.data.home import shipped_dir
from tinymcf_callback.data.sets import CONDITIONS, FOUNDATIONS, RewriteCache, md5, read_set_file
from tinymcf_callback.errors import ProbeDataError
from tinymcf_callback.prepare.rules import MAX_WORDS, RULES_VERSION, rewrite_problems


def test_scifi_set_shape():
    vs = load_vignettes("scifi")
    assert len(vs) == 51
    counts = Counter(v["foundation_coarse"] for v in vs)
    assert counts == {f: 9 if f == "Care" else 7 for f in FOUNDATIONS}, counts  # README: Care 9, six others 7 each
    for v in vs:
        assert v["id"] == md5(v["other_violate"])
        assert v["other_violate"].startswith("You see ")
        assert len(v["other_violate"].split()) < MAX_WORDS
        assert all(isinstance(v[c], str) and v[c] for c in CONDITIONS)
        assert "wrong" not in v  # scifi has no human ratings
    care = {v["foundation"] for v in vs if v["foundation_coarse"] == "Care"}
    assert care == {"Care (e)", "Care (p, a)", "Care (p, h)"}


def test_limit_keeps_stored_order():
    full = load_vignettes("scifi")
    assert [v["id"] for v in load_vignettes("scifi", limit=5)] == [v["id"] for v in full[:5]]
    for bad in (0, -3, True, False, 2.0, "3"):  # a bool is an int to Python, but True is not "1 vignette"
        with pytest.raises(ValueError, match="positive"):
            load_vignettes("scifi", limit=bad)


@pytest.mark.parametrize("cache_file", ["scifi.jsonl", "clifford.jsonl"])
def test_shipped_rewrites_pass_the_lint(cache_file):
    path = shipped_dir("cache") / cache_file
    entries = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert entries
    bad = {(e["source_md5"], e["condition"]): rewrite_problems(e["text"], e["condition"]) for e in entries}
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, bad
    keys = [(e["source_md5"], e["condition"]) for e in entries]
    assert len(keys) == len(set(keys)), "duplicate cache entries"
    assert all(e["producer"] and e["rules_version"] == RULES_VERSION for e in entries)


def test_scifi_originals_pass_the_lint_as_third_person():
    for v in load_vignettes("scifi"):
        assert rewrite_problems(v["other_violate"], "other_violate") == []


@pytest.mark.parametrize("text,condition,needle", [
    ("You see a man helping his neighbour, thus showing he cares.", "other_uphold", "deny-list"),
    ("You see a man helping his neighbour in line with local custom.", "other_uphold", "deny-list"),
    ("You help your neighbour.", "other_uphold", "You see"),
    ("You see yourself helping your neighbour.", "self_uphold", "not \"You see\""),
    ("He helps his neighbour.", "self_violate", "You "),
    ("You see a man. He helps his neighbour.", "other_uphold", "more than one sentence"),
    ("You see a man helping his neighbour; he smiles.", "other_uphold", "more than one sentence"),
    ("You see " + "a very " * 20 + "kind act.", "other_uphold", "words"),
    ("You see a man helping his neighbour", "other_uphold", "full stop"),
])
def test_lint_catches_each_rule(text, condition, needle):
    problems = rewrite_problems(text, condition)
    assert any(needle in p for p in problems), problems


def test_lint_accepts_a_clean_rewrite():
    assert rewrite_problems("You see a robot carrying a lost child back to her parents.", "other_uphold") == []
    assert rewrite_problems("You carry a lost child back to her parents.", "self_uphold") == []


def test_unknown_set_lists_available_and_the_home(tinymcf_home):
    with pytest.raises(ProbeDataError, match=r"'nope'.*clifford, scifi") as e:  # the name, the sets there are
        load_vignettes("nope")
    assert f"read from {tinymcf_home / 'sets'}" in str(e.value) and "--home DIR" in str(e.value)


def test_unprepared_clifford_names_the_command():
    with pytest.raises(ProbeDataError, match=r"tinymcf prepare --name clifford"):
        load_vignettes("clifford")


def test_missing_rewrite_names_vignette_condition_and_command(tmp_path):
    first = read_set_file(shipped_dir("configs") / "scifi.jsonl", "scifi")[0]
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    (cache_dir / "part.jsonl").write_text(json.dumps({
        "source_md5": first["id"], "condition": "other_uphold", "text": "You see a thing.",
        "producer": "test", "rules_version": 1}) + "\n")
    with pytest.raises(ProbeDataError) as e:
        load_vignettes("scifi", limit=1, cache=RewriteCache([cache_dir]))
    msg = str(e.value)
    assert first["id"] in msg and "self_violate" in msg and "tinymcf prepare --name scifi" in msg


def test_malformed_cache_line_names_file_and_line(tmp_path):
    good = json.dumps({"source_md5": "0" * 32, "condition": "self_uphold", "text": "You do it.",
                       "producer": "t", "rules_version": 1})
    (tmp_path / "c.jsonl").write_text(good + "\n{not json\n" + good + "\n")
    with pytest.raises(ProbeDataError, match=r"c\.jsonl:2"):
        RewriteCache([tmp_path])
    (tmp_path / "c.jsonl").write_text(good + "\n" + good.replace("self_uphold", "self_destruct") + "\n")
    with pytest.raises(ProbeDataError, match=r"c\.jsonl:2: .*'self_destruct'"):
        RewriteCache([tmp_path])
    (tmp_path / "c.jsonl").write_text(json.dumps({"source_md5": "0" * 32, "condition": "self_uphold"}) + "\n")
    with pytest.raises(ProbeDataError, match=r"c\.jsonl:1: .*text, producer, rules_version"):
        RewriteCache([tmp_path])


def test_torn_last_cache_line_is_skipped(tmp_path):
    good = json.dumps({"source_md5": "0" * 32, "condition": "self_uphold", "text": "You do it.",
                       "producer": "t", "rules_version": 1})
    (tmp_path / "c.jsonl").write_text(good + "\n" + good[:30])  # an append killed mid-line
    assert len(RewriteCache([tmp_path])) == 1


def test_malformed_set_line_names_file_and_line(tmp_path):
    text = "You see a dragon eating a village's harvest."
    ok = {"id": md5(text), "foundation": "Care (e)", "foundation_coarse": "Care", "text": text}
    p = tmp_path / "s.jsonl"
    p.write_text(json.dumps(ok) + "\n" + json.dumps({**ok, "id": "f" * 32}) + "\n")
    with pytest.raises(ProbeDataError, match=r"s\.jsonl:2: .*f+.*md5"):
        read_set_file(p, "s")
    p.write_text(json.dumps({**ok, "foundation_coarse": "Purity"}) + "\n")
    with pytest.raises(ProbeDataError, match=r"s\.jsonl:1: .*'Purity'"):
        read_set_file(p, "s")
    p.write_text("[1, 2]\n")
    with pytest.raises(ProbeDataError, match=r"s\.jsonl:1"):
        read_set_file(p, "s")


def test_atomic_writes_get_normal_file_modes(tmp_path):
    """A new file gets what open() would give (umask applied), a rewritten one keeps its mode; never 0600 only."""
    import os

    from tinymcf_callback._io import atomic_write_text

    old = os.umask(0o022)
    try:
        path = atomic_write_text(tmp_path / "new.json", "{}")
        assert path.stat().st_mode & 0o777 == 0o644
        os.chmod(path, 0o664)
        atomic_write_text(path, "{}\n")
        assert path.stat().st_mode & 0o777 == 0o664
    finally:
        os.umask(old)


# --- balanced subsets: per_foundation keeps every foundation and the control --------------------

def test_per_foundation_keeps_n_of_each_foundation_in_stored_order():
    from tinymcf_callback import ProbeConfig

    full = load_vignettes("scifi")
    two = load_vignettes("scifi", per_foundation=2)
    assert Counter(v["foundation_coarse"] for v in two) == {f: 2 for f in FOUNDATIONS}  # Social Norms included
    position = {v["id"]: i for i, v in enumerate(full)}
    assert [position[v["id"]] for v in two] == sorted(position[v["id"]] for v in two)
    assert two == load_vignettes("scifi", per_foundation=2)  # stable across calls (and runs: md5 of seed and id)
    assert ProbeConfig(per_foundation=2).vignettes() == two
    other_seed = load_vignettes("scifi", per_foundation=2, subset_seed=1)
    assert Counter(v["foundation_coarse"] for v in other_seed) == {f: 2 for f in FOUNDATIONS}
    assert {v["id"] for v in other_seed} != {v["id"] for v in two}
    # nested: a larger count keeps the smaller one's picks (the same ranking)
    assert {v["id"] for v in two} <= {v["id"] for v in load_vignettes("scifi", per_foundation=4)}
    # more than a foundation has: all of it, and a note that says so
    big = load_vignettes("scifi", per_foundation=8)
    assert Counter(v["foundation_coarse"] for v in big) == {f: 8 if f == "Care" else 7 for f in FOUNDATIONS}
    notes = ProbeConfig(per_foundation=8).subset_notes(big)
    assert len(notes) == 1 and "fewer vignettes than that" in notes[0] and "Fairness (7)" in notes[0]


def test_the_pick_depends_on_the_ids_not_the_file_order():
    from tinymcf_callback.data.sets import balanced_subset

    rows = load_vignettes("scifi")
    picked = {r["id"] for r in balanced_subset(rows, 2, seed=0)}
    assert {r["id"] for r in balanced_subset(list(reversed(rows)), 2, seed=0)} == picked
    with pytest.raises(ValueError, match="positive integer"):
        balanced_subset(rows, 0)


def test_limit_warns_when_it_drops_foundations_or_the_control():
    from tinymcf_callback import ProbeConfig

    config = ProbeConfig(limit=6)
    notes = config.subset_notes(config.vignettes())
    assert len(notes) == 1
    assert "limit=6 keeps the first 6 vignettes of 'scifi' (Care)" in notes[0]
    assert "the Social Norms control" in notes[0] and "per_foundation=2" in notes[0]
    assert ProbeConfig().subset_notes(ProbeConfig().vignettes()) == []
    assert ProbeConfig(per_foundation=2).subset_notes(ProbeConfig(per_foundation=2).vignettes()) == []
    assert "no spread" in ProbeConfig(per_foundation=1).subset_notes(ProbeConfig(per_foundation=1).vignettes())[0]


@pytest.mark.parametrize(("settings", "message"), [
    ({"per_foundation": 0}, "per_foundation must be a positive whole number"),
    ({"per_foundation": True}, "per_foundation must be a positive whole number"),
    ({"per_foundation": 2, "limit": 4}, "limit and per_foundation both choose a subset"),
    ({"target": "Social Norms"}, "target must be one of the real foundations"),
    ({"target": "care"}, "target must be one of the real foundations"),
])
def test_subset_and_target_settings_are_checked_once(settings, message):
    from tinymcf_callback import ProbeConfig
    from tinymcf_callback.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        ProbeConfig(**settings)
