"""The rewrite rules: what every rewrite in the cache must satisfy.

Rewrites turn a third-person violation (``other_violate``) into its three siblings.
The probe compares conditions, so a rewrite must change *only* who acts and whether
the act violates or upholds the foundation: one sentence, the same situation, and no
editorial clause telling the model how to judge (that would leak the answer).
The same checks run on the shipped cache (tests) and on every LLM answer (prepare).
"""

from __future__ import annotations

import re

RULES_VERSION = 1
MAX_WORDS = 35

# Phrases that tell the reader how to judge instead of describing the act.
DENY_LIST = (
    "thus", "thereby", "showing", "demonstrating", "as a sign of", "in line with",
    "in keeping with", "out of respect", "to show", "proving", "honoring", "honouring",
    "respecting", "morally", "ethical", "kindness", "respect for",
)
_DENY_RE = re.compile(r"\b(" + "|".join(re.escape(p) for p in DENY_LIST) + r")\b", re.IGNORECASE)
# A full stop, question or exclamation mark followed by more text starts a second sentence.
_INNER_STOP_RE = re.compile(r"[.!?][\"')\]]*\s+\S")


def rewrite_problems(text: str, condition: str) -> list[str]:
    """Every rule ``text`` breaks as a rewrite for ``condition`` (empty list: it passes)."""
    problems = []
    if not isinstance(text, str) or not text.strip():
        return ["empty text"]
    if text != text.strip():
        problems.append("leading or trailing whitespace")
    words = len(text.split())
    if words > MAX_WORDS:
        problems.append(f"{words} words (at most {MAX_WORDS})")
    if _INNER_STOP_RE.search(text) or ";" in text or "\n" in text:
        problems.append("more than one sentence")
    if not text.rstrip("\"')").endswith((".", "!", "?")):
        problems.append("does not end with a full stop")
    if condition.startswith("other_"):
        if not text.startswith("You see "):
            problems.append('third-person rewrite must start with "You see"')
    elif condition.startswith("self_"):
        if not text.startswith("You ") or text.startswith("You see "):
            problems.append('first-person rewrite must start with "You " but not "You see"')
    else:
        problems.append(f"unknown condition {condition!r}")
    hit = _DENY_RE.search(text)
    if hit:
        problems.append(f"editorial phrase {hit.group(0)!r} (deny-list)")
    return problems
