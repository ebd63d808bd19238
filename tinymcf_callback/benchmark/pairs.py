"""Preference pairs in TRL's preference format, read from a local file or through ``datasets``, checked and sampled.

A pair is a ``prompt`` with a ``chosen`` and a ``rejected`` continuation (TRL's explicit-prompt preference format):
all three plain text, or all three lists of chat messages (``{"role", "content"}``), conversational. Where they come
from (:func:`load_pairs`):

- **a local file** (``.jsonl``, ``.json`` holding a list of records, ``.parquet``, ``.csv``), read with pandas; a
  ``config`` column groups its pairs (``wassname/ethics_expression_preferences``' configs: commonsense, deontology,
  ...), else every pair is of one config named after the file;
- **a Hugging Face dataset** (a Hub name such as ``wassname/ethics_expression_preferences``, or a local folder in
  the Hub's layout), one ``datasets.load_dataset(source, config, split=...)`` per config, through ``datasets`` (the
  ``[prefs]`` extra); with ``HF_HUB_OFFLINE=1`` it must be in the datasets cache.

Every pair is checked before any model is loaded: the three columns are there (the message lists the columns found),
no part is empty, a pair is plain text or conversational throughout, and messages have a role and a text. A subset
is the first ``limit`` pairs of each config, or ``per_config`` pairs drawn from each (seeded), kept in the data's
order. :attr:`Pairs.record` says what was read: the source, the split, the configs, the file's sha256 or the
dataset's revision, and a digest of the pairs themselves.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import MissingExtraError, ProbeDataError
from ..extras import install_hint, require

PAIR_COLUMNS = ("prompt", "chosen", "rejected")  # TRL's preference format (explicit prompt)
CONFIG_COLUMN = "config"  # a local file's optional column: the config (subset) each pair belongs to
FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")
DEFAULT_SPLIT = "test"
PROMPT_ROLES = ("user", "tool", "assistant")  # the roles a prompt may end on, as TRL takes them


@dataclass
class Pairs:
    """Checked preference pairs in the data's order: each part plain text or a message list, its config and row."""

    prompt: list
    chosen: list
    rejected: list
    config: list[str]
    row: list[int]  # the pair's row within its config in the source (0-based)
    conversational: bool
    record: dict = field(default_factory=dict)  # what was read (see the module)

    def __len__(self) -> int:
        return len(self.prompt)

    @property
    def configs(self) -> list[str]:
        """The configs present, in the data's order."""
        return list(dict.fromkeys(self.config))

    def where(self, i: int) -> str:
        """Pair ``i`` named for a message: its config and its row in the source."""
        return f"pair {i} (config {self.config[i]!r}, row {self.row[i]})"


def load_pairs(source: str, *, configs=(), split: str = DEFAULT_SPLIT, revision: str | None = None,
               limit: int | None = None, per_config: int | None = None, seed: int = 0) -> Pairs:
    """The pairs of ``source`` (a local file, a local dataset folder or a Hub dataset name; see the module), checked.

    ``configs``: keep these configs only (a file's ``config`` column, a dataset's configs; default all);
    ``split``: a dataset's split (a file is one split); ``revision``: a Hub dataset's revision; ``limit``: the first
    ``limit`` pairs of each config; ``per_config``: that many pairs drawn from each config with ``seed``. Raises
    :class:`~tinymcf_callback.errors.ProbeDataError` in one line naming what is wrong and how to get it right, and
    :class:`~tinymcf_callback.errors.MissingExtraError` when a dataset source needs ``datasets``.
    """
    configs = tuple(configs or ())
    path = Path(os.path.expanduser(str(source)))
    if path.is_file():
        frames, record = _read_file(path, configs)
    elif path.is_dir():
        frames, record = _read_dataset(str(path), configs, split, revision)
    elif _is_hub_name(str(source)):
        frames, record = _read_dataset(str(source), configs, split, revision)
    else:
        raise ProbeDataError(f"no such file or folder {source}: --prefs takes a local file "
                             f"({', '.join(FILE_SUFFIXES)}), a dataset folder or a Hugging Face dataset name "
                             "(wassname/ethics_expression_preferences)")
    pairs = _checked(frames, str(source))
    pairs = subset(pairs, limit=limit, per_config=per_config, seed=seed)
    pairs.record = {**record, "limit": limit, "per_config": per_config, "seed": seed, "n_pairs": len(pairs),
                    "conversational": pairs.conversational, "digest": pairs_digest(pairs)}
    return pairs


def _is_hub_name(text: str) -> bool:
    """A Hub dataset name (``owner/name`` or ``name``) rather than a path: no file suffix, no leading dot or slash."""
    return not text.startswith((".", "/", "~")) and Path(text).suffix.lower() not in FILE_SUFFIXES \
        and text.count("/") <= 1


# ---- reading -------------------------------------------------------------------------------------------------
def _read_file(path: Path, configs: tuple[str, ...]) -> tuple[list[tuple[str, list[dict]]], dict]:
    """A local file's pairs by config (``(config, records)`` in the file's order) and its record."""
    import pandas as pd

    suffix = path.suffix.lower()
    if suffix not in FILE_SUFFIXES:
        shown = suffix or "a file without a suffix"
        raise ProbeDataError(f"{path}: a preference file must be {', '.join(FILE_SUFFIXES)}, not {shown}")
    data = path.read_bytes()
    try:
        if suffix == ".jsonl":
            records = [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]
        elif suffix == ".json":
            records = json.loads(data.decode("utf-8"))
            if isinstance(records, dict) and isinstance(records.get("data"), list):
                records = records["data"]
        elif suffix == ".csv":
            records = pd.read_csv(path, dtype=str, keep_default_na=False).to_dict(orient="records")
        else:
            records = pd.read_parquet(path).to_dict(orient="records")
    except ImportError:  # pandas reads parquet through pyarrow, which datasets brings
        raise MissingExtraError(f"reading {path} needs pyarrow, which the [prefs] extra brings: "
                                f"{install_hint('datasets')}") from None
    except (UnicodeDecodeError, ValueError, OSError) as e:
        raise ProbeDataError(f"{path} cannot be read as {suffix[1:]}: {' '.join(str(e).split())[:200]}") from None
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise ProbeDataError(f"{path}: expected a list of records (one object per pair), got "
                             f"{type(records).__name__}")
    records = [{k: _plain(v) for k, v in r.items()} for r in records]
    by_config: dict[str, list[dict]] = {}
    for r in records:
        by_config.setdefault(str(r.get(CONFIG_COLUMN, path.stem)), []).append(r)
    frames = _chosen_configs(list(by_config.items()), configs, str(path))
    record = {"source": str(path), "kind": "file", "sha256": hashlib.sha256(data).hexdigest(), "split": None,
              "revision": None, "configs": [c for c, _ in frames]}
    return frames, record


def _plain(value):
    """A value as plain Python (parquet gives numpy arrays of message structs)."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _chosen_configs(frames: list[tuple[str, list[dict]]], configs: tuple[str, ...], where: str):
    if not configs:
        return frames
    have = [c for c, _ in frames]
    unknown = [c for c in configs if c not in have]
    if unknown:
        raise ProbeDataError(f"{where} has no config {', '.join(map(repr, unknown))}; its configs: "
                             f"{', '.join(have)} (--config)")
    return [(c, rows) for c, rows in frames if c in configs]


def _read_dataset(source: str, configs: tuple[str, ...], split: str, revision: str | None):
    """A dataset's pairs by config through ``datasets.load_dataset`` (offline: its cache), and its record."""
    datasets = require("datasets")
    if not configs:
        configs = tuple(_config_names(datasets, source, revision))
    frames, cached = [], {}
    for config in configs:
        ds = _load(datasets, source, config, split, revision)
        frames.append((config, [{k: _plain(v) for k, v in r.items()} for r in ds]))
        cached[config] = _cache_hash(ds)
    record = {"source": source, "kind": "dataset", "sha256": None, "split": split, "revision": revision,
              "cache_hash": cached, "datasets": datasets.__version__, "configs": list(configs)}
    return frames, record


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _fetch_hint(source: str) -> str:
    if _offline():
        return (f"the Hub is off (HF_HUB_OFFLINE=1) and {source} is not in the datasets cache: run once with the Hub "
                f"reachable (HF_HUB_OFFLINE=0), or pass a local file ({', '.join(FILE_SUFFIXES)})")
    return "check the name (a Hugging Face dataset such as wassname/ethics_expression_preferences) or pass a local file"


def _config_names(datasets, source: str, revision: str | None) -> list[str]:
    try:
        return list(datasets.get_dataset_config_names(source, revision=revision))
    except Exception as e:  # noqa: BLE001 - the Hub unreachable, a name that is not a dataset: one line either way
        raise ProbeDataError(f"cannot list the configs of {source} ({_one_line(e)}); {_fetch_hint(source)}; or name "
                             f"the configs with --config") from None


def _load(datasets, source: str, config: str, split: str, revision: str | None):
    try:
        return datasets.load_dataset(source, config, split=split, revision=revision)
    except ValueError as e:
        if "split" in str(e).lower():
            raise ProbeDataError(f"{source} ({config}) has no split {split!r}: {_one_line(e)} (--split)") from None
        raise ProbeDataError(f"cannot read {source} ({config}, {split}): {_one_line(e)}") from None
    except Exception as e:  # noqa: BLE001 - a dataset not cached, a connection refused: one line naming the fix
        raise ProbeDataError(f"cannot read {source} ({config}, {split}): {_one_line(e)}; "
                             f"{_fetch_hint(source)}") from None


def _cache_hash(ds) -> str | None:
    """The folder ``datasets`` cached a dataset under (its builder's hash: for a Hub dataset, tied to the commit it
    was read at), or None when it is held in memory."""
    for f in getattr(ds, "cache_files", None) or []:
        parts = Path(f.get("filename", "")).parts
        if len(parts) >= 2:
            return parts[-2]
    return None


def _one_line(error: Exception) -> str:
    return f"{type(error).__name__}: {' '.join(str(error).split())[:200]}"


# ---- checking ------------------------------------------------------------------------------------------------
def _checked(frames: list[tuple[str, list[dict]]], source: str) -> Pairs:
    """Every pair checked (see the module), in the data's order."""
    found = list(dict.fromkeys(k for _, rows in frames for r in rows for k in r))
    missing = [c for c in PAIR_COLUMNS if c not in found]
    if missing:
        implicit = " (an implicit prompt inside chosen and rejected: split it out with trl's extract_prompt)" \
            if "prompt" in missing and "chosen" in found else ""
        raise ProbeDataError(f"{source}: preference pairs need the columns {', '.join(PAIR_COLUMNS)} (TRL's "
                             f"preference format); missing {', '.join(missing)}{implicit}; found: "
                             f"{', '.join(found) or 'none'}")
    pairs = Pairs([], [], [], [], [], conversational=False)
    for config, rows in frames:
        for n, r in enumerate(rows):
            pairs.prompt.append(r.get("prompt"))
            pairs.chosen.append(r.get("chosen"))
            pairs.rejected.append(r.get("rejected"))
            pairs.config.append(config)
            pairs.row.append(n)
    if not len(pairs):
        raise ProbeDataError(f"{source} holds no pairs")
    kinds = [_kind(pairs, i, source) for i in range(len(pairs))]
    if len(set(kinds)) > 1:
        first = kinds.index("conversational")
        other = kinds.index("plain")
        raise ProbeDataError(f"{source}: {pairs.where(first)} is conversational and {pairs.where(other)} plain text: "
                             f"one set of pairs is one or the other")
    pairs.conversational = kinds[0] == "conversational"
    return pairs


def _kind(pairs: Pairs, i: int, source: str) -> str:
    parts = {c: getattr(pairs, c)[i] for c in PAIR_COLUMNS}
    if all(isinstance(v, str) for v in parts.values()):
        for column, value in parts.items():
            if not value:
                raise ProbeDataError(f"{source}: {pairs.where(i)} has an empty {column}: every pair needs a prompt "
                                     "and two non-empty continuations")
        return "plain"
    if all(isinstance(v, list) for v in parts.values()):
        for column, value in parts.items():
            _check_messages(value, column, f"{source}: {pairs.where(i)}")
        last = parts["prompt"][-1]["role"]
        if last not in PROMPT_ROLES:
            raise ProbeDataError(f"{source}: {pairs.where(i)}'s prompt ends with a {last!r} message; TRL's format "
                                 f"ends a prompt with {', '.join(PROMPT_ROLES)}")
        return "conversational"
    kinds = {c: type(v).__name__ for c, v in parts.items()}
    raise ProbeDataError(f"{source}: {pairs.where(i)} mixes plain text and message lists ({kinds}): a pair is three "
                         "strings, or three lists of {'role', 'content'} messages")


def _check_messages(messages: list, column: str, where: str) -> None:
    if not messages:
        raise ProbeDataError(f"{where} has an empty {column} (no message): every pair needs a prompt and two "
                             "non-empty continuations")
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ProbeDataError(f"{where}: its {column} holds {m!r}, not a {{'role', 'content'}} message of text")
    if column != "prompt" and not any(m["content"] for m in messages):
        raise ProbeDataError(f"{where} has an empty {column} (its messages hold no text): every pair needs two "
                             "non-empty continuations")


# ---- subsets and identity ------------------------------------------------------------------------------------
def subset(pairs: Pairs, *, limit: int | None = None, per_config: int | None = None, seed: int = 0) -> Pairs:
    """The first ``limit`` pairs of each config, or ``per_config`` pairs drawn from each with ``seed`` (a config with
    fewer gives them all), in the data's order."""
    if limit is None and per_config is None:
        return pairs
    keep = []
    for c in pairs.configs:
        rows = [i for i, config in enumerate(pairs.config) if config == c]
        if limit is not None:
            rows = rows[:limit]
        if per_config is not None and per_config < len(rows):
            drawn = np.random.default_rng([seed, _stable(c)]).choice(len(rows), size=per_config, replace=False)
            rows = [rows[j] for j in sorted(drawn.tolist())]
        keep += rows
    keep.sort()
    return Pairs(*([getattr(pairs, c)[i] for i in keep] for c in (*PAIR_COLUMNS, "config", "row")),
                 conversational=pairs.conversational, record=dict(pairs.record))


def _stable(text: str) -> int:
    """A seed part from ``text`` that is the same in every process (``hash`` of a str is not)."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:4], "big")


def pairs_digest(pairs: Pairs) -> str:
    """sha256 over every pair's config, row and texts: two scorings of the same pairs have the same digest."""
    h = hashlib.sha256()
    for i in range(len(pairs)):
        h.update(json.dumps([pairs.config[i], pairs.row[i], pairs.prompt[i], pairs.chosen[i], pairs.rejected[i]],
                            ensure_ascii=False, sort_keys=True).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()
