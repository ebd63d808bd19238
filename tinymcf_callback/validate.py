"""Judge validation of a prepared set: does each text engage the foundation it is meant to?

``python -m tinymcf_callback.prepare --validate --name NAME`` (or
``python -m tinymcf_callback.validate --name NAME``) asks a judge model, for every
vignette and each of the four conditions, which of the seven foundations the act
engages and whether the actor violates or upholds it. Verdicts are cached by
``(md5 of the judged text, judge model)`` in ``<cache-dir>/judgements.jsonl``, so a rerun
asks only for what is new. The report gives foundation accuracy per condition (the
original, ``other_violate``, is the ceiling the rewrites can reach), valence accuracy, a
confusion matrix and the flagged rewrites; one JSON line per judged text goes to
``--out`` (default ``./validate_<name>.jsonl``).
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pandas as pd

from ._io import append_jsonl, atomic_write_text, read_jsonl
from .llm import Cancelled, FatalLLMError, ItemFailed, PrepareError, ask_json, run_pool
from .sets import (
    CONDITIONS, FOUNDATIONS, JUDGEMENTS_FILE, RewriteCache, load_vignettes, md5, user_cache_dir,
)

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


def load_judgements(dirs: list[Path]) -> dict[tuple[str, str], dict]:
    out: dict[tuple[str, str], dict] = {}
    for d in dirs:
        path = Path(d) / JUDGEMENTS_FILE
        if not path.is_file():
            continue
        try:
            lines = read_jsonl(path)
        except ValueError as e:
            raise PrepareError(f"malformed judgement cache: {e}") from None
        for _, obj in lines:
            if {"text_md5", "judge_model", "foundation", "valence"} <= obj.keys():
                out[(obj["text_md5"], obj["judge_model"])] = obj
    return out


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


def validate_set(args, secrets: list, say) -> int:
    from .prepare import cache_dirs, check_writable, make_client, model_list

    name = args.name
    cache_dir = Path(args.cache_dir).expanduser() if args.cache_dir else user_cache_dir()
    dirs = cache_dirs(cache_dir)
    vignettes = load_vignettes(name, limit=args.limit, cache=RewriteCache(dirs))
    judge = args.judge_model or args.model
    known = load_judgements([d for d in dirs[1:]])
    items = [(v, c) for v in vignettes for c in CONDITIONS]
    todo: dict[str, str] = {}
    for v, c in items:
        h = md5(v[c])
        if (h, judge) not in known:
            todo.setdefault(h, v[c])
    jpath = cache_dir / JUDGEMENTS_FILE
    if args.dry_run:
        say(f"dry run: would ask {judge} at {args.base_url} for {len(todo)} judgements "
            f"({len(items) - len(todo)} of {len(items)} texts already judged), appending to {jpath}")
        for h, text in todo.items():
            say(f"  {h}  {text[:80]}")
        return 0
    failed: dict[str, str] = {}
    if todo:
        cancel = threading.Event()
        client = make_client(args, secrets, f"{len(todo)} judgements of set {name!r} by {judge} are not cached",
                             cancel)
        check_writable(cache_dir)
        models = model_list(judge, args.fallback_model)

        def work(item):
            _, text = item
            return ask_json(client, models, lambda fb: judge_messages(text, fb), check_judgement,
                            attempts=args.attempts)

        def on_result(item, res):
            h, _ = item
            if isinstance(res, ItemFailed):
                failed[h] = str(res)
                return
            if isinstance(res, Cancelled):
                return
            (foundation, valence), model = res
            entry = {"text_md5": h, "judge_model": judge, "foundation": foundation, "valence": valence,
                     "producer": f"llm:{model}"}
            try:
                append_jsonl(jpath, entry)
            except OSError as e:
                raise PrepareError(f"cannot append to {jpath} ({e.strerror or e})") from None
            known[(h, judge)] = entry

        say(f"{name}: asking {' then '.join(models)} for {len(todo)} judgements")
        try:
            run_pool(list(todo.items()), work, concurrency=args.concurrency, cancel=cancel, on_result=on_result,
                     desc=f"judge {name}", progress=False if args.no_progress else None)
        except KeyboardInterrupt:
            say(f"interrupted: the judgements made so far are saved in {jpath}; rerun to finish.")
            raise
        except FatalLLMError as e:
            raise PrepareError(str(e)) from None

    records = []
    for v, c in items:
        h = md5(v[c])
        j = known.get((h, judge))
        exp_val = "violate" if c.endswith("violate") else "uphold"
        rec = {"id": v["id"], "condition": c, "text": v[c], "expected_foundation": v["foundation_coarse"],
               "expected_valence": exp_val, "judged_foundation": j["foundation"] if j else None,
               "judged_valence": j["valence"] if j else None, "judge_model": judge}
        rec["foundation_ok"] = (j["foundation"] == v["foundation_coarse"]) if j else None
        rec["valence_ok"] = (j["valence"] == exp_val) if j else None
        rec["error"] = failed.get(h) if not j else None
        records.append(rec)
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

    out = Path(args.out).expanduser() if args.out else Path.cwd() / f"validate_{name}.jsonl"
    try:
        atomic_write_text(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    except OSError as e:
        raise PrepareError(f"cannot write {out} ({e.strerror or e})") from None

    per, confusion = summarize(records)
    with pd.option_context("display.width", 160, "display.max_columns", 20, "display.float_format", "{:.2f}".format):
        say(f"{name}: judge {judge}, {len(vignettes)} vignettes x {len(CONDITIONS)} conditions "
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
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    from .prepare import main as prepare_main

    argv = list(sys.argv[1:] if argv is None else argv)
    return prepare_main(["--validate", *[a for a in argv if a != "--validate"]])


if __name__ == "__main__":
    sys.exit(main())
