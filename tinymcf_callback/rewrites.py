"""The three rewrites of every vignette (``other_uphold``, ``self_violate``, ``self_uphold``), made by an LLM.

This module owns the rewrite prompt, the check of an answer against the rules
(:mod:`tinymcf_callback.rules`, the same rules the shipped cache passes), the plan of
what is missing from the caches, and :func:`make_rewrites`, which hands that plan to the
shared request loop (:mod:`tinymcf_callback.request_loop`). New rewrites are appended to
``<home>/cache/<name>.jsonl``.
"""

from __future__ import annotations

from collections.abc import Callable

from . import rules
from .home import HOME_VAR, Folders, folders, shipped_dir
from .request_loop import Job, model_list, open_client, run_job
from .sets import REWRITE_CONDITIONS, RewriteCache, builtin_sets
from .store import append_entries, check_writable

LABEL_HINTS = {"Care (e)": "emotional harm", "Care (p, a)": "physical harm to animals",
               "Care (p, h)": "physical harm to humans", "Social Norms": "a social convention, not a moral norm"}

REWRITE_SYSTEM = (
    "You rewrite short moral vignettes for a psychology experiment on Moral Foundations Theory. "
    "Each vignette describes, in the third person, someone violating a moral foundation. You write one "
    "sibling version that changes ONLY who acts and/or whether the act violates or upholds the foundation: "
    "keep the same situation, the same kind of people, the same place and a similar level of detail.\n"
    "Rules for every rewrite:\n"
    f"- exactly one sentence of at most {rules.MAX_WORDS} words, ending with a full stop; no semicolons, "
    "no line breaks;\n"
    "- describe the act only, never how to judge it; do not use these words or phrases: "
    + ", ".join(rules.DENY_LIST) + ";\n"
    '- third-person versions start with "You see "; first-person versions start with "You " but not '
    '"You see".\n'
    'Answer with a JSON object {"rewrite": "<the sentence>"} and nothing else.'
)
REWRITE_TASKS = {
    "other_uphold": 'Keep the third person (start with "You see "): the same kind of person, in the same '
                    "situation, does something that upholds this foundation instead of violating it.",
    "self_violate": 'Make the reader the actor (start with "You ", not "You see"): you do the same act.',
    "self_uphold": 'Make the reader the actor (start with "You ", not "You see"): in the same situation, you '
                   "do something that upholds this foundation instead of violating it.",
}


# --------------------------------------------------------------------------- one rewrite


def rewrite_messages(row: dict, condition: str, feedback: list | None = None) -> list[dict]:
    """The chat messages that ask for ``condition``'s rewrite of vignette ``row``.

    ``feedback`` is the list of ``(previous answer, problems)`` of this model so far; each
    is sent back with the rules it broke.
    """
    label = row["foundation"]
    hint = LABEL_HINTS.get(label)
    user = (
        "Task: rewrite\n"
        f"Condition: {condition}\n"
        f"Foundation: {label}{f' ({hint})' if hint else ''}\n"
        f"Original (other_violate): {row['text']}\n"
        f"Instruction: {REWRITE_TASKS[condition]}\n"
        'Answer as {"rewrite": "..."}.'
    )
    messages = [{"role": "system", "content": REWRITE_SYSTEM}, {"role": "user", "content": user}]
    for content, problems in feedback or []:
        messages.append({"role": "assistant", "content": content or ""})
        messages.append({"role": "user", "content": "That rewrite breaks these rules: " + "; ".join(problems)
                         + '. Write it again, following every rule. Answer as {"rewrite": "..."}.'})
    return messages


def check_rewrite(row: dict, condition: str) -> Callable[[dict], tuple[str | None, list[str]]]:
    """The check of an answer ``{"rewrite": ...}``: ``(text, problems)``; no problems means it passes."""

    def check(obj: dict):
        text = obj.get("rewrite")
        if not isinstance(text, str):
            return None, ['the answer has no "rewrite" string']
        text = text.strip()
        problems = rules.rewrite_problems(text, condition)
        if text == row["text"].strip():
            problems.append("identical to the original")
        return text, problems

    return check


def rewrite_entry(row: dict, condition: str, text: str, model: str) -> dict:
    """The cache line of a rewrite that passed (the shipped cache's fields, in its order)."""
    return {"source_md5": row["id"], "condition": condition, "text": text, "producer": f"llm:{model}",
            "rules_version": rules.RULES_VERSION}


# --------------------------------------------------------------------------- planning


def missing_rewrites(rows: list[dict], cache: RewriteCache) -> list[tuple[dict, str]]:
    """``(row, condition)`` of every rewrite of ``rows`` that no cache folder has, in stored order."""
    return [(r, c) for r in rows for c in REWRITE_CONDITIONS if (r["id"], c) not in cache]


def legacy_only_rewrites(rows: list[dict], f: Folders) -> list[dict]:
    """Rewrites of ``rows`` found in a deprecated cache folder and not yet in the home.

    A legacy entry equal to the shipped one is left out; one that differs from it (a
    user's re-made rewrite, which overrode the shipped one) is kept.
    """
    if not f.legacy:
        return []
    legacy, home, shipped = RewriteCache(list(f.legacy)), RewriteCache([f.cache]), RewriteCache([shipped_dir("cache")])
    out = []
    for r in rows:
        for c in REWRITE_CONDITIONS:
            entry = legacy.get(r["id"], c)
            if entry is None or (r["id"], c) in home:
                continue
            ship = shipped.get(r["id"], c)
            if ship is None or ship["text"] != entry["text"]:
                out.append(entry)
    return out


# --------------------------------------------------------------------------- the job


def make_rewrites(name: str, rows: list[dict], args, secrets: list, say: Callable[[str], None]) -> int:
    """Request the rewrites of set ``name`` that no cache has; 0 when all are there, 1 when some failed."""
    f = folders(args.cache_dir)
    out_path = f.rewrites_file(name)
    adopt_legacy_rewrites(name, rows, f, dry_run=args.dry_run, say=say)
    todo = rows[: args.limit] if args.limit else rows
    missing = missing_rewrites(todo, RewriteCache(f.rewrite_dirs))
    total = 3 * len(todo)
    scope = f"the first {len(todo)} of {len(rows)} vignettes" if len(todo) < len(rows) else f"{len(rows)} vignettes"
    if not missing:
        say(f"{name}: all {total} rewrites of {scope} are in the cache; nothing to request.")
        say(ready_line(name, args))
        return 0
    models = model_list(args.model, args.fallback_model)
    if args.dry_run:
        say(f"dry run: would request {len(missing)} of the {total} rewrites of {scope} of {name!r} "
            f"from {' then '.join(models)} at {args.base_url}, appending to {out_path}:")
        for r, c in missing:
            say(f"  {r['id']}  {c:<13} [{r['foundation']}] {r['text'][:70]}")
        return 0
    client = open_client(args, secrets, f"{len(missing)} of the {total} rewrites of set {name!r} are missing "
                                        f"from the cache")
    check_writable(f.cache)
    job = Job("rewrites", name, out_path, models,
              messages=lambda item, feedback: rewrite_messages(item[0], item[1], feedback),
              check=lambda item: check_rewrite(*item),
              entry=lambda item, text, model: rewrite_entry(item[0], item[1], text, model))
    say(f"{name}: requesting {len(missing)} rewrites ({total - len(missing)} of {total} already cached) from "
        f"{' then '.join(models)} at {args.base_url}")
    done, failed = run_job(job, missing, client, concurrency=args.concurrency, attempts=args.attempts,
                           progress=False if args.no_progress else None, say=say)
    say(f"{name}: {total} rewrites for {scope}: {total - len(missing)} cached, {len(done)} done, "
        f"{len(failed)} failed")
    if failed:
        say("failed (never cached; rerun the same command to retry them):")
        for (row, cond), why in failed:
            say(f"  {row['id']} {cond}: {why}")
        return 1
    say(ready_line(name, args) + f"; new rewrites in {out_path}")
    return 0


def adopt_legacy_rewrites(name: str, rows: list[dict], f: Folders, *, dry_run: bool,
                          say: Callable[[str], None]) -> int:
    """Copy the set's rewrites found only in a deprecated cache folder into the home (that folder is left as is)."""
    entries = legacy_only_rewrites(rows, f)
    if not entries:
        return 0
    legacy = ", ".join(str(d) for d in f.legacy)
    dest = f.rewrites_file(name)
    if dry_run:
        say(f"dry run: would copy {len(entries)} rewrites of {name!r} from the deprecated cache folder {legacy} "
            f"into {dest}")
        return 0
    check_writable(f.cache)
    n = append_entries(dest, entries)
    say(f"{name}: copied {n} rewrites from the deprecated cache folder {legacy} into {dest} (the old folder is "
        f"left as it is; evaluate() no longer needs it)")
    return n


def ready_line(name: str, args) -> str:
    """How to use the set now; names the home when it came from ``--home`` (a bundled set needs none)."""
    line = f"ready: tinymcf_callback.evaluate(model, tok, name={name!r})"
    if getattr(args, "home", None) and builtin_sets().get(name, {}).get("source") != "bundled":
        home = folders().home
        line += f" with {HOME_VAR}={home} (or --home {home} on the eval CLI)"
    return line
