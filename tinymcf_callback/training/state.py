"""The callback's counters in ``trainer_state.json``: saved at every checkpoint, read back when a run resumes.

Several callbacks of one class share one key of ``stateful_callbacks`` (the Trainer stores a list,
appended to at each save); each probe finds its own entry by its set's name and answer format.
"""

from __future__ import annotations

from ..scoring.prompts import DEFAULT_ANSWER_FORMAT


def _find(stateful_callbacks: dict | None, key: str, name: str, answer_format: str) -> tuple[list, list[int]]:
    """The entries under ``key``, and the indices of this probe's (states saved before formats existed are Yes/No)."""
    stored = (stateful_callbacks or {}).get(key)
    entries = stored if isinstance(stored, list) else [stored] if stored else []
    return entries, [i for i, e in enumerate(entries) if isinstance(e, dict) and e.get("args", {}).get("name") == name
                     and e["args"].get("answer_format", DEFAULT_ANSWER_FORMAT) == answer_format]


def stored_counters(stateful_callbacks: dict | None, key: str, name: str,
                    answer_format: str = DEFAULT_ANSWER_FORMAT) -> dict | None:
    """The newest saved state of the ``key`` callback probing set ``name`` in ``answer_format``, or None."""
    entries, mine = _find(stateful_callbacks, key, name, answer_format)
    return entries[mine[-1]] if mine else None


def record_counters(stateful_callbacks: dict, key: str, name: str, saved: dict,
                    answer_format: str = DEFAULT_ANSWER_FORMAT) -> None:
    """Replace (or add) the saved state of the ``key`` callback probing set ``name`` in ``answer_format``: one entry
    per set and answer format (the Trainer appends every callback's state at each save; older entries of this set are
    dropped, so ``trainer_state.json``, which holds the baseline's scores, does not grow with the saves)."""
    entries, mine = _find(stateful_callbacks, key, name, answer_format)
    if mine:
        entries[mine[-1]] = saved
        entries = [e for i, e in enumerate(entries) if i not in mine[:-1]]
    else:
        entries.append(saved)
    stateful_callbacks[key] = entries[0] if len(entries) == 1 else entries


