"""The three rewrites of every vignette (``other_uphold``, ``self_violate``, ``self_uphold``), made by an LLM.

This module owns the rewrite prompt, the check of an answer against :mod:`~tinymcf_callback.prepare.rules`, the plan
of what is missing from the caches, and :func:`make_rewrites`, which hands that plan to the shared request loop.
"""

from __future__ import annotations

from collections.abc import Callable

from ..data.home import HOME_VAR, folders
from ..data.sets import REWRITE_CONDITIONS, RewriteCache, builtin_sets
from ..errors import MissingExtraError
from . import rules
from .request_loop import Job, model_list, open_client, run_job
from .store import check_writable

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
    '"You see";\n'
    "- an upholding version describes a plainly positive act of the same foundation (a loyal act, not a "
    "refused betrayal; tending a grave, not reburying what robbers dug up): it adds no negative word "
    "(refuse, attack, dangerous, thieves, funeral, broken...) that the original does not contain.\n"
    'Answer with a JSON object {"rewrite": "<the sentence>"} and nothing else.'
)
REWRITE_TASKS = {
    "other_uphold": 'Keep the third person (start with "You see "): the same kind of person, in the same '
                    "situation, does something plainly positive that upholds this foundation (not a refusal to "
                    "violate it).",
    "self_violate": 'Make the reader the actor (start with "You ", not "You see"): you do the same act.',
    "self_uphold": 'Make the reader the actor (start with "You ", not "You see"): in the same situation, you '
                   "do something plainly positive that upholds this foundation (not a refusal to violate it).",
}


# --------------------------------------------------------------------------- one rewrite


def rewrite_messages(row: dict, condition: str, feedback: list | None = None) -> list[dict]:
    """The chat messages that ask for ``condition``'s rewrite of vignette ``row``; each ``(previous answer, problems)``
    of ``feedback`` is sent back with the rules it broke."""
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
        problems = rules.rewrite_problems(text, condition, original=row["text"])
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


def outdated_rewrites(rows: list[dict], cache: RewriteCache) -> list[tuple[dict, dict]]:
    """``(row, entry)`` of every cached rewrite of ``rows`` made under older rules than :data:`rules.RULES_VERSION`
    (used as they are, never dropped or re-requested)."""
    entries = ((r, cache.get(r["id"], c)) for r in rows for c in REWRITE_CONDITIONS)
    return [(r, e) for r, e in entries if e is not None and _version(e) < rules.RULES_VERSION]


def _version(entry: dict) -> int:
    v = entry.get("rules_version")
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


# --------------------------------------------------------------------------- the job


def make_rewrites(name: str, rows: list[dict], args, secrets: list, say: Callable[[str], None]) -> int:
    """Request the rewrites of set ``name`` that no cache has; 0 when all are there, 1 when some failed."""
    f = folders()
    out_path = f.rewrites_file(name)
    todo = rows[: args.limit] if args.limit else rows
    cache = RewriteCache(f.rewrite_dirs)
    note_outdated(name, outdated_rewrites(todo, cache), say)
    missing = missing_rewrites(todo, cache)
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
    rules.sentiment_analyzer()  # the lexical-cue rule checks every uphold: fail before any request
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
    say(f"spot-check them before trusting the eval: {show_command(name, args)}")
    return 0


def note_outdated(name: str, outdated: list[tuple[dict, dict]], say: Callable[[str], None]) -> None:
    """Say which cached rewrites made under older rules break today's; they stay in use, untouched."""
    if not outdated:
        return
    try:
        broken = [(row, e, p) for row, e in outdated
                  if (p := rules.rewrite_problems(e["text"], e["condition"], original=row["text"]))]
    except MissingExtraError as e:  # no lexicon: say what could not be checked, do not stop a run that needs none
        say(f"note: {len(outdated)} cached rewrites of {name!r} were made under older rules than version "
            f"{rules.RULES_VERSION}; they are used as they are, unchecked ({e})")
        return
    if not broken:
        return
    say(f"note: {len(broken)} cached rewrites of {name!r} made under older rules break rules version "
        f"{rules.RULES_VERSION}; they are used as they are. To have one remade, delete its line from the file "
        f"named and rerun this command:")
    for row, e, problems in broken[:10]:
        say(f"  {e['_file']}:{e['_line']} {row['id']} {e['condition']}: {'; '.join(problems)}")
    if len(broken) > 10:
        say(f"  ... and {len(broken) - 10} more")


def show_command(name: str, args) -> str:
    """The spot-check command for set ``name`` (with ``--home`` when this run used one)."""
    home = f" --home {args.home}" if getattr(args, "home", None) else ""
    return f"tinymcf show --name {name} -n 10{home}"


def ready_line(name: str, args) -> str:
    """How to use the set now; names the home when it came from ``--home`` (a bundled set needs none)."""
    line = f"ready: tinymcf_callback.evaluate(model, tok, name={name!r})"
    if getattr(args, "home", None) and builtin_sets().get(name, {}).get("source") != "bundled":
        home = folders().home
        line += f" with {HOME_VAR}={home} (or --home {home} on the tinymcf commands)"
    return line
