"""``python -m tinymcf_callback.prepare``: make a vignette set ready for the probe (one-time, offline after).

* ``--name clifford`` downloads the Clifford et al. (2015) CSV from the URL in
  ``configs/sets.json`` (or reads ``--source PATH``), checks it (columns, 132 rows,
  foundation labels, sha256) and stores the raw file and the normalized set in the
  user data directory. Its rewrites are shipped, so no API key is needed.
* ``--name myset --source my.csv`` (or ``.jsonl``) registers your own set there and has
  its three rewrites per vignette made by an LLM through any OpenAI-compatible API.
* ``--validate --name NAME`` asks a judge model which foundation each text engages
  (see :mod:`tinymcf_callback.validate`).

Only rewrites missing from the caches are requested; each is appended to
``<cache-dir>/<name>.jsonl`` the moment it passes the rules, so an interrupted run loses
nothing and a rerun finishes the rest. Bad input raises :class:`PrepareError`; the CLI
prints ``error: ...`` and exits with status 2.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import re
import sys
import tempfile
import threading
import traceback
import urllib.error
import urllib.request
from pathlib import Path

from . import rules
from ._io import append_jsonl, atomic_write_bytes, atomic_write_text, read_jsonl
from .llm import (
    DEFAULT_BASE_URL, DEFAULT_MODEL, KEY_VARS, Cancelled, ChatClient, FatalLLMError, ItemFailed, PrepareError,
    ask_json, find_api_key, no_key_message, read_dotenv, run_pool, scrub,
)
from .sets import (
    FOUNDATIONS, REWRITE_CONDITIONS, ProbeDataError, RewriteCache, md5, read_set_file, registry, set_path,
    shipped_dir, user_cache_dir, user_dir,
)

__all__ = ["PrepareError", "main", "normalize_clifford", "read_user_source", "rewrite_messages"]

CLIFFORD_COLUMNS = ("Scenario", "Foundation", "Care", "Fairness", "Loyalty", "Authority", "Sanctity", "Liberty",
                    "Not Wrong", "Wrong")
REASON_COLUMNS = ("Care", "Fairness", "Loyalty", "Authority", "Sanctity", "Liberty", "Not Wrong")
CLIFFORD_LABELS = {"Care (e)": "Care", "Care (p, a)": "Care", "Care (p, h)": "Care",
                   **{f: f for f in FOUNDATIONS if f != "Care"}}
LABEL_HINTS = {"Care (e)": "emotional harm", "Care (p, a)": "physical harm to animals",
               "Care (p, h)": "physical harm to humans", "Social Norms": "a social convention, not a moral norm"}
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_PERCENT_RE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*%\s*$")


# --------------------------------------------------------------------------- labels and rows


def coarse_of(label: str) -> str | None:
    """The coarse foundation of a label: itself, or the part before `` (`` ("Care (p, a)" -> "Care")."""
    label = " ".join(str(label).split())
    base = label.split(" (", 1)[0] if label.endswith(")") and " (" in label else label
    for f in FOUNDATIONS:
        if base.lower() == f.lower():
            return f
    return None


def _number(value, where: str, what: str) -> float:
    s = str(value).strip()
    m = _PERCENT_RE.match(s)
    try:
        return round(float(m.group(1)) / 100.0, 6) if m else float(s)
    except ValueError:
        raise PrepareError(f"{where}: {what} {value!r} is not a number") from None


def _row(text: str, label: str, where: str, wrong=None, reasons: dict | None = None) -> dict:
    if not isinstance(text, str) or not text.strip():
        raise PrepareError(f"{where}: empty scenario text")
    if not isinstance(label, str) or not label.strip():
        raise PrepareError(f"{where}: missing foundation label")
    coarse = coarse_of(label)
    if coarse is None:
        raise PrepareError(
            f"{where}: unknown foundation label {label!r} (expected one of {', '.join(FOUNDATIONS)}, "
            f"optionally with a detail in brackets such as 'Care (e)')"
        )
    out = {"id": md5(text), "foundation": " ".join(label.split()), "foundation_coarse": coarse, "text": text}
    if wrong is not None:
        out["wrong"] = wrong
    if reasons:
        out["reasons"] = reasons
    return out


# --------------------------------------------------------------------------- the Clifford CSV


def _decode(data: bytes, origin: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise PrepareError(f"{origin}: not UTF-8 text (byte {e.start}); is this the right file?") from None


def _looks_like_html(data: bytes, content_type: str = "") -> bool:
    head = data[:512].lstrip().lower()
    return "html" in content_type.lower() or head.startswith((b"<!doctype html", b"<html", b"<head", b"<?xml"))


def normalize_clifford(data: bytes, origin: str, rows_expected: int | None = 132) -> list[dict]:
    """Check the Clifford CSV (columns, row count, labels, numbers) and return the normalized rows."""
    if _looks_like_html(data):
        raise PrepareError(f"{origin}: got an HTML page, not the Clifford CSV (a login or error page?)")
    reader = csv.reader(io.StringIO(_decode(data, origin), newline=""))
    header = next(reader, None)
    if not header:
        raise PrepareError(f"{origin}: the file is empty")
    header = [h.strip() for h in header]
    missing = [c for c in CLIFFORD_COLUMNS if c not in header]
    if missing:
        raise PrepareError(f"{origin}: missing columns {', '.join(missing)} (found: {', '.join(header)})")
    col = {c: header.index(c) for c in CLIFFORD_COLUMNS}
    out, seen = [], {}
    for i, fields in enumerate(reader, start=1):
        if not any(f.strip() for f in fields):
            continue
        where = f"{origin}: row {i} (line {reader.line_num})"
        if len(fields) != len(header):
            raise PrepareError(f"{where}: {len(fields)} fields, the header has {len(header)}")
        label = fields[col["Foundation"]].strip()
        if label not in CLIFFORD_LABELS:
            raise PrepareError(f"{where}: unknown foundation label {label!r} (expected one of "
                               f"{', '.join(CLIFFORD_LABELS)})")
        text = fields[col["Scenario"]]  # verbatim: its md5 keys the shipped rewrites
        reasons = {r: _number(fields[col[r]], where, f"{r!r} share") for r in REASON_COLUMNS}
        row = _row(text, label, where, _number(fields[col["Wrong"]], where, "'Wrong' rating"), reasons)
        if row["id"] in seen:
            raise PrepareError(f"{where}: the same scenario as row {seen[row['id']]}")
        seen[row["id"]] = i
        out.append(row)
    if rows_expected is not None and len(out) != rows_expected:
        raise PrepareError(f"{origin}: {len(out)} vignette rows, expected {rows_expected}; "
                           f"the file is incomplete or not the Clifford CSV")
    return out


def download(url: str, timeout: float = 60.0) -> bytes:
    """The bytes at ``url`` (urllib); a failure or an HTML page raises :class:`PrepareError`."""
    req = urllib.request.Request(url, headers={"User-Agent": "tinymcf_callback-prepare"})
    hint = "check your connection, or download the file yourself and pass --source PATH"
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            data = resp.read()
            ctype = resp.headers.get("Content-Type", "") or ""
    except urllib.error.HTTPError as e:
        raise PrepareError(f"download of {url} failed: HTTP {e.code} {e.reason}; {hint}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise PrepareError(f"download of {url} failed: {reason}; {hint}") from None
    if _looks_like_html(data, ctype):
        raise PrepareError(f"download of {url} returned an HTML page, not the CSV; {hint}")
    if not data.strip():
        raise PrepareError(f"download of {url} returned an empty file; {hint}")
    return data


# --------------------------------------------------------------------------- users' own sets


def read_user_source(path: str | Path) -> list[dict]:
    """A user's scenarios (CSV with ``Scenario``/``text`` and ``Foundation`` columns, or JSONL)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise PrepareError(f"--source {path}: no such file")
    suffix = path.suffix.lower()
    if suffix in (".csv", ".tsv"):
        rows = _read_user_csv(path, "\t" if suffix == ".tsv" else ",")
    elif suffix in (".jsonl", ".ndjson"):
        rows = _read_user_jsonl(path)
    else:
        raise PrepareError(f"--source {path}: unsupported format {suffix or '(none)'}; use .csv or .jsonl")
    if not rows:
        raise PrepareError(f"{path}: no vignettes in the file")
    rated = [r for r in rows if "wrong" in r]
    if rated and len(rated) != len(rows):
        first = next(r for r in rows if "wrong" not in r)
        raise PrepareError(f"{first.pop('_where')}: no human rating, but other rows have one "
                           f"(give a rating for every vignette or for none)")
    seen: dict[str, str] = {}
    for r in rows:
        where = r.pop("_where")
        if r["id"] in seen:
            raise PrepareError(f"{where}: the same scenario as {seen[r['id']]}")
        seen[r["id"]] = where
    return rows


def _pick(keys, *names):
    low = {str(k).strip().lower(): k for k in keys}
    for n in names:
        if n in low:
            return low[n]
    return None


def _user_row(obj: dict, where: str, text_key, label_key, wrong_key) -> dict:
    text = obj.get(text_key)
    text = text.strip() if isinstance(text, str) else text
    wrong = obj.get(wrong_key) if wrong_key is not None else None
    wrong = None if wrong is None or (isinstance(wrong, str) and not wrong.strip()) else _number(wrong, where, "rating")
    reasons = {}
    for r in REASON_COLUMNS:
        k = _pick(obj.keys(), r.lower())
        if k is not None and k not in (label_key, text_key) and str(obj[k]).strip():
            reasons[r] = _number(obj[k], where, f"{r!r} share")
    label = obj.get(label_key)
    row = _row(text, label.strip() if isinstance(label, str) else label, where, wrong, reasons or None)
    row["_where"] = where
    return row


def _read_user_csv(path: Path, delimiter: str) -> list[dict]:
    data = path.read_bytes()
    if _looks_like_html(data):
        raise PrepareError(f"{path}: an HTML page, not a CSV file")
    reader = csv.DictReader(io.StringIO(_decode(data, str(path)), newline=""), delimiter=delimiter)
    fields = reader.fieldnames or []
    text_key, label_key = _pick(fields, "scenario", "text"), _pick(fields, "foundation")
    if text_key is None or label_key is None:
        raise PrepareError(f"{path}: missing column(s) {'Scenario (or text)' if text_key is None else ''}"
                           f"{' and ' if text_key is None and label_key is None else ''}"
                           f"{'Foundation' if label_key is None else ''} (found: {', '.join(fields) or 'none'})")
    wrong_key = _pick(fields, "wrong")
    out = []
    for i, obj in enumerate(reader, start=1):
        if not any((v or "").strip() for v in obj.values() if isinstance(v, str)):
            continue
        if None in obj or None in obj.values():
            raise PrepareError(f"{path}: row {i} (line {reader.line_num}): the number of fields differs from "
                               f"the header's {len(fields)} (a comma inside an unquoted field?)")
        out.append(_user_row(obj, f"{path}: row {i} (line {reader.line_num})", text_key, label_key, wrong_key))
    return out


def _read_user_jsonl(path: Path) -> list[dict]:
    try:
        lines = read_jsonl(path)
    except (ValueError, UnicodeDecodeError) as e:
        raise PrepareError(str(e)) from None
    out = []
    for lineno, obj in lines:
        where = f"{path}: line {lineno}"
        text_key, label_key = _pick(obj.keys(), "text", "scenario"), _pick(obj.keys(), "foundation")
        if text_key is None or label_key is None:
            raise PrepareError(f"{where}: needs the keys 'text' and 'foundation' (found: {', '.join(obj)})")
        out.append(_user_row(obj, where, text_key, label_key, _pick(obj.keys(), "wrong")))
    return out


# --------------------------------------------------------------------------- rewrites

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


def rewrite_messages(row: dict, condition: str, feedback: list | None = None) -> list[dict]:
    """The chat messages that ask for ``condition``'s rewrite of vignette ``row``."""
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


def _check_rewrite(row: dict, condition: str):
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


def cache_dirs(cache_dir: Path | None) -> list[Path]:
    """Where rewrites are looked up: the shipped cache, the user cache and ``--cache-dir``."""
    dirs = [shipped_dir("cache"), user_cache_dir()]
    if cache_dir is not None and all(cache_dir.resolve() != d.resolve() for d in dirs):
        dirs.append(cache_dir)
    return dirs


def check_writable(folder: Path) -> None:
    """Raise :class:`PrepareError` unless files can be created in ``folder`` (made if missing)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test-", delete=True):
            pass
    except OSError as e:
        raise PrepareError(f"the cache directory {folder} is not writable ({e.strerror or e}); "
                           f"pass --cache-dir DIR with a folder you can write") from None


def make_client(args, secrets: list, what: str, cancel: threading.Event) -> ChatClient:
    key, _where = find_api_key()
    if not key:
        raise PrepareError(no_key_message(what))
    secrets.append(key)
    return ChatClient(args.base_url, key, timeout=args.timeout, retries=args.retries, backoff=args.backoff,
                      json_mode=not args.no_json_mode, cancel=cancel)


def model_list(primary: str, fallback: str | None) -> list[str]:
    return [primary] + ([fallback] if fallback and fallback != primary else [])


def make_rewrites(name: str, rows: list[dict], args, secrets: list, say) -> int:
    cache_dir = Path(args.cache_dir).expanduser() if args.cache_dir else user_cache_dir()
    cache = RewriteCache(cache_dirs(cache_dir))
    todo = rows[: args.limit] if args.limit else rows
    missing = [(r, c) for r in todo for c in REWRITE_CONDITIONS if (r["id"], c) not in cache]
    total = 3 * len(todo)
    scope = f"the first {len(todo)} of {len(rows)} vignettes" if len(todo) < len(rows) else f"{len(rows)} vignettes"
    if not missing:
        say(f"{name}: all {total} rewrites of {scope} are in the cache; nothing to request.")
        say(f"ready: tinymcf_callback.evaluate(model, tok, name={name!r})")
        return 0
    models = model_list(args.model, args.fallback_model)
    if args.dry_run:
        say(f"dry run: would request {len(missing)} of the {total} rewrites of {scope} of {name!r} "
            f"from {' then '.join(models)} at {args.base_url}, appending to {cache_dir / (name + '.jsonl')}:")
        for r, c in missing:
            say(f"  {r['id']}  {c:<13} [{r['foundation']}] {r['text'][:70]}")
        return 0
    cancel = threading.Event()
    client = make_client(args, secrets, f"{len(missing)} of the {total} rewrites of set {name!r} are missing "
                                        f"from the cache", cancel)
    check_writable(cache_dir)
    out_path = cache_dir / f"{name}.jsonl"
    done, failed = [], []

    def work(item):
        row, cond = item
        return ask_json(client, models, lambda fb: rewrite_messages(row, cond, fb), _check_rewrite(row, cond),
                        attempts=args.attempts)

    def on_result(item, res):
        row, cond = item
        if isinstance(res, ItemFailed):
            failed.append((row["id"], cond, str(res)))
            return
        if isinstance(res, Cancelled):
            return
        text, model = res
        entry = {"source_md5": row["id"], "condition": cond, "text": text, "producer": f"llm:{model}",
                 "rules_version": rules.RULES_VERSION}
        try:
            append_jsonl(out_path, entry)
        except OSError as e:
            raise PrepareError(f"cannot append to {out_path} ({e.strerror or e})") from None
        done.append(entry)

    say(f"{name}: requesting {len(missing)} rewrites ({total - len(missing)} of {total} already cached) from "
        f"{' then '.join(models)} at {args.base_url}")
    try:
        run_pool(missing, work, concurrency=args.concurrency, cancel=cancel, on_result=on_result,
                 desc=f"rewrites {name}", progress=False if args.no_progress else None)
    except KeyboardInterrupt:
        say(f"interrupted: {len(done)} new rewrites saved in {out_path} so far (requests in flight are saved as they "
            f"finish); rerun the same command to finish.")
        raise
    except FatalLLMError as e:
        raise PrepareError(f"{e} ({len(done)} rewrites made before this are saved in {out_path})") from None
    say(f"{name}: {total} rewrites for {scope}: {total - len(missing)} cached, {len(done)} done, "
        f"{len(failed)} failed")
    if failed:
        say("failed (never cached; rerun the same command to retry them):")
        for vid, cond, why in failed:
            say(f"  {vid} {cond}: {why}")
        return 1
    say(f"ready: tinymcf_callback.evaluate(model, tok, name={name!r}); new rewrites in {out_path}")
    if cache_dir.resolve() != user_cache_dir().resolve():
        say(f"note: evaluate() reads {cache_dir} only when TINYMCF_CACHE_DIR={cache_dir} is set")
    return 0


# --------------------------------------------------------------------------- the sets


def _write_set(name: str, rows: list[dict]) -> Path:
    path = user_dir() / "sets" / f"{name}.jsonl"
    try:
        atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    except OSError as e:
        raise PrepareError(f"cannot write the set file {path} ({e.strerror or e})") from None
    return path


def prepare_download(name: str, spec: dict, args, say) -> list[dict]:
    """Download (or read ``--source``), verify and store a downloadable built-in set."""
    fmt = spec.get("format", "csv")
    raw_path = user_dir() / "raw" / f"{name}.{fmt}"
    expected = spec.get("sha256")
    data, origin, from_raw = None, None, False
    if args.source:
        src = Path(args.source).expanduser()
        try:
            data = src.read_bytes()
        except OSError as e:
            raise PrepareError(f"--source {src}: cannot read ({e.strerror or e})") from None
        origin = str(src)
    elif raw_path.is_file() and not args.url and not args.force_download:
        data, origin, from_raw = raw_path.read_bytes(), str(raw_path), True
        if expected and hashlib.sha256(data).hexdigest() != expected and not args.allow_checksum_change:
            data, from_raw = None, False  # a stale or damaged copy: fetch again
    if data is None:
        url = args.url or spec["url"]
        say(f"{name}: downloading {url}")
        data, origin = download(url, timeout=args.timeout), url
    rows = normalize_clifford(data, origin, spec.get("rows"))
    actual = hashlib.sha256(data).hexdigest()
    if expected and actual != expected:
        if not args.allow_checksum_change:
            raise PrepareError(
                f"{origin}: sha256 checksum differs: expected {expected} (configs/sets.json), actual {actual}. "
                f"The file changed upstream or is a different version; rerun with --allow-checksum-change to "
                f"accept it (scenarios whose text changed then need new rewrites, i.e. an API key)"
            )
        say(f"warning: {origin}: sha256 {actual} differs from the expected {expected}; accepted "
            f"(--allow-checksum-change)")
    if args.dry_run:
        say(f"dry run: {origin} is valid ({len(rows)} vignettes); would store it in {raw_path} and "
            f"{user_dir() / 'sets' / (name + '.jsonl')}")
        return rows
    if not from_raw:
        try:
            atomic_write_bytes(raw_path, data)  # the exact bytes: their sha256 is checked on reuse
        except OSError as e:
            raise PrepareError(f"cannot write {raw_path} ({e.strerror or e})") from None
    path = _write_set(name, rows)
    say(f"{name}: {len(rows)} vignettes checked and stored in {path}")
    return rows


def prepare_user_set(name: str, args, say) -> list[dict]:
    src = Path(args.source).expanduser()
    rows = read_user_source(src)
    odd = sum(not r["text"].startswith("You see ") for r in rows)
    if odd:
        say(f"note: {odd} of {len(rows)} vignettes do not start with 'You see' like the built-in sets; "
            f"the probe still works, but third-person rewrites will start that way")
    human = all("wrong" in r for r in rows)
    if args.dry_run:
        say(f"dry run: {src} is valid ({len(rows)} vignettes); would register set {name!r} in "
            f"{user_dir() / 'sets'}")
        return rows
    path = _write_set(name, rows)
    meta = {
        "description": args.description or f"user set prepared from {src.name} ({len(rows)} vignettes)",
        "source": "user",
        "human_ratings": human,
        "created_from": str(src.resolve()),
        "rows": len(rows),
        "format": "jsonl",
    }
    meta_path = path.with_suffix(".json")
    try:
        atomic_write_text(meta_path, json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
    except OSError as e:
        raise PrepareError(f"cannot write {meta_path} ({e.strerror or e})") from None
    say(f"{name}: {len(rows)} vignettes registered in {path}" + (" (with human ratings)" if human else ""))
    return rows


def builtin_sets() -> dict:
    return json.loads((shipped_dir("configs") / "sets.json").read_text(encoding="utf-8"))


def run_prepare(args, secrets: list, say) -> int:
    name = args.name
    if not _NAME_RE.match(name or ""):
        raise PrepareError(f"bad set name {name!r}: use letters, digits, '-' and '_' (at most 64)")
    builtins = builtin_sets()
    if name in builtins:
        spec = builtins[name]
        if spec.get("source") == "download":
            rows = prepare_download(name, spec, args, say)
        else:
            if args.source:
                raise PrepareError(f"{name!r} is a built-in set shipped with the package; choose another --name "
                                   f"for your own set (built-in: {', '.join(sorted(builtins))})")
            rows = read_set_file(set_path(name), name)
    else:
        if args.url:
            raise PrepareError(f"--url only applies to downloadable built-in sets "
                               f"({', '.join(n for n, s in builtins.items() if s.get('source') == 'download')})")
        if args.source:
            rows = prepare_user_set(name, args, say)
        elif name in registry():
            rows = read_set_file(set_path(name), name)
        else:
            raise PrepareError(f"unknown set {name!r} (known: {', '.join(sorted(registry()))}); to make your own, "
                               f"pass --source FILE.csv or FILE.jsonl with Scenario/text and Foundation columns")
    return make_rewrites(name, rows, args, secrets, say)


# --------------------------------------------------------------------------- the CLI


def build_parser(prog: str = "python -m tinymcf_callback.prepare") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Make a vignette set ready for the probe: download and "
                                "check Clifford, register your own set, have missing rewrites made by an LLM.")
    p.add_argument("--name", required=True, help="the set: clifford, or a name for your own set")
    p.add_argument("--source", help="a local copy of the Clifford CSV, or your own scenarios (.csv or .jsonl)")
    p.add_argument("--url", help="download from this URL instead of the one in configs/sets.json")
    p.add_argument("--force-download", action="store_true", help="download again even if a verified copy exists")
    p.add_argument("--allow-checksum-change", action="store_true",
                   help="accept a downloaded file whose sha256 differs from configs/sets.json")
    p.add_argument("--description", help="description of your own set (stored in its metadata)")
    p.add_argument("--cache-dir", help="where new rewrites and judgements go (default: the user cache dir, "
                                       "$TINYMCF_CACHE_DIR or $TINYMCF_HOME/cache)")
    p.add_argument("--base-url", default=DEFAULT_BASE_URL, help="any OpenAI-compatible endpoint (default: %(default)s)")
    p.add_argument("--model", default=DEFAULT_MODEL, help="the model that writes the rewrites (default: %(default)s)")
    p.add_argument("--fallback-model", help="asked when the model refuses, answers no JSON or keeps breaking rules")
    p.add_argument("--judge-model", help="the judge for --validate (default: --model)")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight at once (default: %(default)s)")
    p.add_argument("--attempts", type=int, default=3, help="tries per model for an answer that breaks the rules (default: %(default)s)")
    p.add_argument("--retries", type=int, default=5, help="retries on rate limits (429), 5xx and timeouts (default: %(default)s)")
    p.add_argument("--backoff", type=float, default=1.0, help="first retry delay in seconds (doubles each retry) (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per request (and for the download) (default: %(default)s)")
    p.add_argument("--no-json-mode", action="store_true", help="do not send response_format=json_object")
    p.add_argument("--limit", type=int, help="only the first N vignettes (smoke tests)")
    p.add_argument("--dry-run", action="store_true", help="show what would be requested; no key, nothing written")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--validate", action="store_true", help="ask a judge model about every text of the set")
    p.add_argument("--out", help="--validate results (JSONL; default ./validate_<name>.jsonl)")
    return p


def known_secrets() -> list[str]:
    """Every key value this process could use, so that no message can show one."""
    import os

    vals = [os.environ.get(v) for v in KEY_VARS]
    dot = read_dotenv(Path.cwd() / ".env")
    vals += [dot.get(v) for v in KEY_VARS]
    return [v.strip() for v in vals if v and v.strip()]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.limit is not None and args.limit <= 0:
        print("error: --limit must be a positive integer", file=sys.stderr)
        return 2
    if args.concurrency < 1 or args.attempts < 1 or args.retries < 0 or args.backoff < 0 or args.timeout <= 0:
        print("error: --concurrency and --attempts must be >= 1, --retries and --backoff >= 0, --timeout > 0",
              file=sys.stderr)
        return 2
    secrets = known_secrets()

    def say(msg: str) -> None:
        print(scrub(msg, secrets), flush=True)

    try:
        if args.validate:
            from .validate import validate_set

            return validate_set(args, secrets, say)
        return run_prepare(args, secrets, say)
    except (PrepareError, ProbeDataError) as e:
        print(f"error: {scrub(e, secrets)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; everything finished so far is saved. Rerun the same command to continue.",
              file=sys.stderr)
        return 130
    except Exception:  # a bug: show it, without the key
        print(scrub(traceback.format_exc(), secrets), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
