"""The rewrite rules: what every rewrite in the cache must satisfy.

A rewrite changes *only* who acts and whether the act violates or upholds the foundation: one sentence, the same
situation, no editorial clause telling the model how to judge (that would leak the answer). Rules version 2 adds the
lexical-cue rule for upholds, checked with the VADER lexicon (``vaderSentiment``, imported only when it runs, so
scoring never needs it): why and what it measured, docs/preparing.md. The same checks run on the shipped cache (tests)
and on every LLM answer (prepare).
"""

from __future__ import annotations

import re
from functools import lru_cache

from ..extras import require

RULES_VERSION = 2  # 2: the lexical-cue rule for upholds (rewrites of version 1 were made without it)
MAX_WORDS = 35
CUE_VALENCE = -1.0  # a word scored at or below this in the VADER lexicon is a negative cue
COMPOUND_FLOOR = -0.3  # an uphold may read below this only if its violation reads at least as low
LEXICON_PACKAGE = "vaderSentiment"

# Phrases that tell the reader how to judge instead of describing the act.
DENY_LIST = (
    "thus", "thereby", "showing", "demonstrating", "as a sign of", "in line with",
    "in keeping with", "out of respect", "to show", "proving", "honoring", "honouring",
    "respecting", "morally", "ethical", "kindness", "respect for",
)
_DENY_RE = re.compile(r"\b(" + "|".join(re.escape(p) for p in DENY_LIST) + r")\b", re.IGNORECASE)
# A full stop, question or exclamation mark followed by more text starts a second sentence.
_INNER_STOP_RE = re.compile(r"[.!?][\"')\]]*\s+\S")


def rewrite_problems(text: str, condition: str, original: str | None = None) -> list[str]:
    """Every rule ``text`` breaks as a rewrite for ``condition`` (empty list: it passes); with ``original`` (the
    violation it rewrites) an uphold is also checked for lexical cues (:func:`lexical_cue_problems`)."""
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
    if original is not None and condition.endswith("_uphold"):
        problems += lexical_cue_problems(text, original)
    return problems


# --------------------------------------------------------------------------- lexical cues

_WORD_RE = re.compile(r"[a-z]+(?:['’-][a-z]+)*")


def lexicon_words(text: str) -> set[str]:
    """The lower-cased words of ``text`` as the lexicon spells them: possessive 's dropped, hyphen parts too."""
    out = set()
    for w in _WORD_RE.findall(text.lower().replace("’", "'")):
        w = w.removesuffix("'s")
        out.add(w)
        out.update(w.split("-"))
    return out


@lru_cache(maxsize=1)
def sentiment_analyzer():
    """VADER's analyzer (its lexicon loaded once); :class:`MissingExtraError` naming ``[prepare]`` without it."""
    return require(f"{LEXICON_PACKAGE}.vaderSentiment").SentimentIntensityAnalyzer()


def word_stem(word: str) -> str:
    """``word`` without one regular inflection (-ing, -ed, -es, -s) and a final e: "dislikes" and "dislike" match."""
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            break
    return word.removesuffix("e")


def added_cue_words(text: str, original: str) -> dict[str, float]:
    """Words of ``text`` with lexicon valence <= ``CUE_VALENCE`` that ``original`` does not contain.

    A word counts as contained when the original has it in another regular inflection
    ("a student you dislike" rewrites "a student he dislikes"): the situation is the same.
    """
    lexicon = sentiment_analyzer().lexicon
    seen = {word_stem(w) for w in lexicon_words(original)}
    return {w: lexicon[w] for w in sorted(lexicon_words(text))
            if lexicon.get(w, 0.0) <= CUE_VALENCE and word_stem(w) not in seen}


def compound(text: str) -> float:
    """VADER's overall sentiment of ``text``, from -1 (most negative) to 1."""
    return sentiment_analyzer().polarity_scores(text)["compound"]


def lexical_cue_problems(text: str, original: str) -> list[str]:
    """What makes the upholding ``text`` read negative where its violation ``original`` does not."""
    problems = []
    added = added_cue_words(text, original)
    if added:
        words = ", ".join(f"{w!r} ({v:+.1f})" for w, v in added.items())
        problems.append(f"adds negative words the original does not contain: {words} (lexical cue); describe a "
                        f"plainly positive act of the same foundation, not a refused or prevented violation")
    c, c_orig = compound(text), compound(original)
    if c < COMPOUND_FLOOR and c < c_orig:
        problems.append(f"reads more negative than the original (sentiment {c:+.2f}, below {COMPOUND_FLOOR} and "
                        f"the original's {c_orig:+.2f}) (lexical cue)")
    return problems
