"""What the tests of the preparation side share: the fake key, the command, the option sets, small files."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from tinymcf_callback._io import read_jsonl
from tinymcf_callback.cli.main import main

KEY = "sk-test-SECRET-123"
CLIFFORD_SHA = "b69a0589517a7b1cc7ab1d8a5034721f468c172d888d765bc81d4dc5e920f0c1"


def cli(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def api(server, model="good-model", *extra):
    return ["--base-url", server.base_url, "--model", model, "--backoff", "0.01", "--timeout", "5",
            "--no-progress", *extra]


def write_csv(path: Path, rows, header=("Scenario", "Foundation", "Wrong")) -> Path:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    path.write_text(buf.getvalue(), encoding="utf-8")
    return path


MY_ROWS = [
    ("You see a man kicking a stray dog in the park.", "Care (p, a)", "3.2"),
    ("You see a girl cheating at cards against her grandmother.", "Fairness", "2.5"),
    ("You see a soldier mocking his own unit to a rival army.", "Loyalty", "2.9"),
    ("You see a man eating soup with a fork at a diner.", "Social Norms", "0.3"),
]


def my_csv(tmp_path, rows=MY_ROWS, name="my.csv") -> Path:
    return write_csv(tmp_path / name, rows)


def cache_lines(path: Path) -> list[dict]:
    return [obj for _, obj in read_jsonl(path)] if path.exists() else []


def snapshot(*dirs) -> dict:
    out = {}
    for d in dirs:
        d = Path(d)
        if d.exists():
            for p in d.rglob("*"):
                if p.is_file():
                    out[str(p)] = p.read_bytes()
    return out
