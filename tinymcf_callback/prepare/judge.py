"""Judge validation of a prepared set (``tinymcf validate --name NAME``): does each text engage the foundation it is
meant to? Verdicts are cached by ``(md5 of the text, judge model)`` in ``<home>/cache/judgements.jsonl``; the report
and its fields: docs/preparing.md.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd

from .._io import read_jsonl
from ..data.home import JUDGEMENTS_FILE, folders
from ..data.sets import CONDITIONS, FOUNDATIONS, RewriteCache, load_vignettes, md5
from ..errors import PrepareError
from .request_loop import Job, model_list, open_client, run_job
from .store import check_writable, write_jsonl

VALENCES = ("violate", "uphold")

JUDGE_SYSTEM = (
    "You classify short moral scenarios with Moral Foundations Theory. The foundations are: "
    "Care (harm to others, emotional or physical, people or animals), Fairness (cheating, free-riding, "
    "unequal treatment), Loyalty (betraying or standing by one's group), Authority (disrespecting or "
    "obeying legitimate authority and tradition), Sanctity (degrading or keeping purity, disgusting acts), "
    "Liberty (coercing or leaving people free), Social Norms (unusual but harmless conventions, no moral "
    "foundation involved). For the act described, name the ONE foundation it engages most and say whether the "
    'actor violates or upholds it. Answer with a JSON object {"foundation": "<one of Care, Fairness, '
    'Loyalty, Authority, Sanctity, Liberty, Social Norms>", "valence": "violate" or "uphold"} and nothing else.'
)


def judge_messages(text: str, feedback: list | None = None) -> list[dict]:
    """The chat messages that ask the judge about ``text``; invalid earlier answers are sent back."""
    messages = [
        {"role": "system", "content": JUDGE_SYSTEM},
        {"role": "user", "content": f"Task: classify\nScenario: {text}\n"
                                    'Answer as {"foundation": "...", "valence": "violate|uphold"}.'},
    ]
    for content, problems in feedback or []:
        messages.append({"role": "assistant", "content": content or ""})
        messages.append({"role": "user", "content": "Invalid answer: " + "; ".join(problems) + ". Answer again."})
    return messages


def check_judgement(obj: dict):
    """``((foundation, valence), problems)`` of a judge's answer; no problems means it is usable."""
    problems = []
    f = str(obj.get("foundation", "")).strip()
    found = next((x for x in FOUNDATIONS if x.lower() == f.lower()), None)
    if found is None:
        problems.append(f"foundation {f!r} is not one of {', '.join(FOUNDATIONS)}")
    v = str(obj.get("valence", "")).strip().lower()
    v = {"violates": "violate", "upholds": "uphold"}.get(v, v)
    if v not in VALENCES:
        problems.append(f"valence {v!r} is not 'violate' or 'uphold'")
    return (found, v), problems


def judgement_entry(text_md5: str, judge: str, verdict: tuple[str, str], model: str) -> dict:
    """The cache line of a verdict: keyed by the judged text's md5 and the judge asked (``--judge-model``)."""
    foundation, valence = verdict
    return {"text_md5": text_md5, "judge_model": judge, "foundation": foundation, "valence": valence,
            "producer": f"llm:{model}"}


def load_judgements(dirs: list[Path]) -> dict[tuple[str, str], dict]:
    """Cached verdicts by ``(text md5, judge model)``; a later folder's verdict wins."""
    out: dict[tuple[str, str], dict] = {}
    for d in dirs:
        path = Path(d) / JUDGEMENTS_FILE
        if not path.is_file():
            continue
        try:
            lines = read_jsonl(path, torn_tail=True)  # appended one verdict at a time
        except ValueError as e:
            raise PrepareError(f"malformed judgement cache: {e}") from None
        for _, obj in lines:
            if {"text_md5", "judge_model", "foundation", "valence"} <= obj.keys():
                out[(obj["text_md5"], obj["judge_model"])] = obj
    return out


# --------------------------------------------------------------------------- planning


def judge_records(vignettes: list[dict], known: dict, judge: str, failed: dict[str, str]) -> list[dict]:
    """One record per (vignette, condition): expected and judged foundation and valence, flagged or not.

    A rewrite is flagged when its judged valence is wrong, or when its judged foundation
    is wrong while the original (``other_violate``) was judged right.
    """
    records = []
    for v in vignettes:
        for c in CONDITIONS:
            h = md5(v[c])
            j = known.get((h, judge))
            exp_val = "violate" if c.endswith("violate") else "uphold"
            records.append({
                "id": v["id"], "condition": c, "text": v[c], "expected_foundation": v["foundation_coarse"],
                "expected_valence": exp_val, "judged_foundation": j["foundation"] if j else None,
                "judged_valence": j["valence"] if j else None, "judge_model": judge,
                "foundation_ok": (j["foundation"] == v["foundation_coarse"]) if j else None,
                "valence_ok": (j["valence"] == exp_val) if j else None,
                "error": failed.get(h) if not j else None,
            })
    original = {r["id"]: r for r in records if r["condition"] == "other_violate"}
    for r in records:
        why = []
        if r["condition"] != "other_violate" and r["judged_foundation"] is not None:
            if r["valence_ok"] is False:
                why.append(f"judged {r['judged_valence']}, expected {r['expected_valence']}")
            if r["foundation_ok"] is False and original[r["id"]]["foundation_ok"]:
                why.append(f"judged {r['judged_foundation']} while the original is judged "
                           f"{r['expected_foundation']}")
        r["flagged"] = bool(why)
        r["flag_reason"] = "; ".join(why) or None
    return records


def summarize(records: list[dict]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-condition accuracies and the foundation confusion matrix (expected x judged)."""
    df = pd.DataFrame(records)
    judged = df[df["judged_foundation"].notna()]
    per = pd.DataFrame(index=pd.Index(CONDITIONS, name="condition"))
    per["n"] = df.groupby("condition").size().reindex(CONDITIONS).fillna(0).astype(int)
    per["judged"] = judged.groupby("condition").size().reindex(CONDITIONS).fillna(0).astype(int)
    per["foundation_acc"] = judged.groupby("condition")["foundation_ok"].mean().reindex(CONDITIONS)
    per["valence_acc"] = judged.groupby("condition")["valence_ok"].mean().reindex(CONDITIONS)
    confusion = pd.crosstab(judged["expected_foundation"], judged["judged_foundation"],
                            rownames=["expected"], colnames=["judged"]) if len(judged) else pd.DataFrame()
    return per, confusion


# --------------------------------------------------------------------------- the job


def validate_set(args, secrets: list, say: Callable[[str], None]) -> int:
    """Judge every text of set ``args.name``, print the report, write ``--out``; 1 when a verdict failed."""
    name = args.name
    f = folders()
    vignettes = load_vignettes(name, limit=args.limit, cache=RewriteCache(f.rewrite_dirs))
    judge = args.judge_model or args.model
    texts = {md5(v[c]): v[c] for v in vignettes for c in CONDITIONS}
    known = load_judgements([f.cache])
    todo = {h: t for h, t in texts.items() if (h, judge) not in known}  # in order
    n_items = len(vignettes) * len(CONDITIONS)
    if args.dry_run:
        say(f"dry run: would ask {judge} at {args.base_url} for {len(todo)} judgements "
            f"({n_items - len(todo)} of {n_items} texts already judged), appending to {f.judgements_file}")
        for h, text in todo.items():
            say(f"  {h}  {text[:80]}")
        return 0
    failed: dict[str, str] = {}
    if todo:
        client = open_client(args, secrets, f"{len(todo)} judgements of set {name!r} by {judge} are not cached")
        check_writable(f.cache)
        models = model_list(judge, args.fallback_model)
        job = Job("judgements", name, f.judgements_file, models,
                  messages=lambda item, feedback: judge_messages(item[1], feedback),
                  check=lambda item: check_judgement,
                  entry=lambda item, verdict, model: judgement_entry(item[0], judge, verdict, model))
        say(f"{name}: asking {' then '.join(models)} for {len(todo)} judgements")
        done, failures = run_job(job, list(todo.items()), client, concurrency=args.concurrency,
                                 attempts=args.attempts, progress=False if args.no_progress else None, say=say)
        known.update({(e["text_md5"], judge): e for e in done})
        failed = {h: why for (h, _text), why in failures}

    records = judge_records(vignettes, known, judge, failed)
    out = Path(args.out).expanduser() if args.out else Path.cwd() / f"validate_{name}.jsonl"
    write_jsonl(out, records)
    print_report(name, judge, len(vignettes), records, failed, out, say)
    return 1 if failed else 0


def print_report(name: str, judge: str, n_vignettes: int, records: list[dict], failed: dict[str, str], out: Path,
                 say: Callable[[str], None]) -> None:
    per, confusion = summarize(records)
    with pd.option_context("display.width", 160, "display.max_columns", 20, "display.float_format", "{:.2f}".format):
        say(f"{name}: judge {judge}, {n_vignettes} vignettes x {len(CONDITIONS)} conditions "
            f"(other_violate, the original, is the ceiling for the rewrites)")
        say(per.to_string())
        if len(confusion):
            say("foundation confusion (rows: expected, columns: judged):")
            say(confusion.to_string())
    flagged = [r for r in records if r["flagged"]]
    say(f"flagged rewrites: {len(flagged)}")
    for r in flagged:
        say(f"  {r['id']} {r['condition']}: {r['flag_reason']}: {r['text']}")
    if failed:
        say(f"failed judgements (not cached; rerun to retry): {len(failed)}")
        for h, why in failed.items():
            say(f"  {h}: {why}")
    say(f"results: {out}")
