"""mkdocs hook: the tables the code owns, put into the pages when the docs are built.

``{{ schema:<part> }}`` is a part of the JSON report's schema (``tinymcf_callback.rundir.report.SCHEMA``),
``{{ history_line }}`` the history line's fields, ``{{ settings }}`` every ProbeConfig field with
its default, option and help; ``{{ prefs_block }}``, ``{{ lm_eval_block }}`` and ``{{ bench_line }}`` the slow
benchmark's. So the docs cannot drift from the formats and settings the code has.
"""

from __future__ import annotations

import re
from dataclasses import MISSING, fields


def _settings_table() -> str:
    import argparse

    from tinymcf_callback.cli.options import add_probe_options
    from tinymcf_callback.config import ProbeConfig

    parser = argparse.ArgumentParser()
    add_probe_options(parser)  # the options as the command line has them
    rows = ["| setting | default | on the command line | what it does |", "|---|---|---|---|"]
    for f in fields(ProbeConfig):
        action = [a for a in parser._actions if a.dest == f.name][-1]  # a switch on by default: its --no- form
        option = action.option_strings[0] + (f" {action.metavar or 'VALUE'}" if action.nargs is None else "")
        default = f.default if f.default is not MISSING else None
        rows.append(f"| `{f.name}` | `{default!r}` | `{option}` | {f.metadata['help'].replace('|', chr(92) + '|')} |")
    return "\n".join(rows)


def _prefs_fields():
    from tinymcf_callback.benchmark.analysis import PREFS_FIELDS

    return PREFS_FIELDS


def _lm_eval_fields():
    from tinymcf_callback.benchmark.lmeval import LM_EVAL_FIELDS

    return LM_EVAL_FIELDS


def _bench_line_fields():
    from tinymcf_callback.benchmark.history import BENCH_LINE_FIELDS

    return BENCH_LINE_FIELDS


BENCHMARK_TABLES = {"prefs_block": _prefs_fields, "lm_eval_block": _lm_eval_fields, "bench_line": _bench_line_fields}


def _replace(match: re.Match) -> str:
    from tinymcf_callback.rundir.history import (
        DOSE_LINE_FIELDS,
        LINE_FIELDS,
        OUTSIDE_LINE_FIELDS,
        SUPERSEDING_LINE_FIELDS,
    )
    from tinymcf_callback.rundir.report import schema_markdown

    name = match.group(1).strip()
    if name == "settings":
        return _settings_table()
    if name == "history_line":
        return schema_markdown(LINE_FIELDS)
    if name == "dose_line":
        return schema_markdown(DOSE_LINE_FIELDS)
    if name == "outside_line":
        return schema_markdown(OUTSIDE_LINE_FIELDS)
    if name == "superseding_line":
        return schema_markdown(SUPERSEDING_LINE_FIELDS)
    if name in BENCHMARK_TABLES:
        return schema_markdown(BENCHMARK_TABLES[name]())
    if name.startswith("schema:"):
        return schema_markdown(name.split(":", 1)[1])
    raise ValueError(f"unknown docs placeholder {{{{ {name} }}}}")


def on_page_markdown(markdown: str, **kwargs) -> str:
    return re.sub(r"\{\{\s*([a-z_:]+)\s*\}\}", _replace, markdown)
