"""The command line shared by ``python -m tinymcf_callback.prepare`` and ``python -m tinymcf_callback.validate``.

One parser (both commands take the same options), one check of the numbers, and
:func:`run_cli`, which runs a command inside the chosen home and turns its outcome into
the exit status: 0 done, 1 some requests failed (listed), 2 ``error: ...`` (bad input or
setup, nothing half-written), 130 interrupted. No message ever shows an API key.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from .errors import PrepareError
from .home import HOME_VAR, folders, using_home
from .llm import DEFAULT_BASE_URL, DEFAULT_MODEL, KEY_VARS, read_dotenv, scrub
from .sets import ProbeDataError

Command = Callable[[argparse.Namespace, list, Callable[[str], None]], int]


def build_parser(prog: str = "python -m tinymcf_callback.prepare") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Make a vignette set ready for the probe: download and "
                                "check Clifford, register your own set, have missing rewrites made by an LLM.")
    p.add_argument("--name", required=True, help="the set: clifford, or a name for your own set")
    p.add_argument("--source", help="a local copy of the Clifford CSV, or your own scenarios (.csv or .jsonl)")
    p.add_argument("--home", metavar="DIR",
                   help=f"where everything is written and read back: prepared sets, raw downloads, new rewrites "
                        f"and judgements (default: ${HOME_VAR}, else the platform's user data folder)")
    p.add_argument("--url", help="download from this URL instead of the one in configs/sets.json")
    p.add_argument("--force-download", action="store_true", help="download again even if a verified copy exists")
    p.add_argument("--allow-checksum-change", action="store_true",
                   help="accept a downloaded file whose sha256 differs from configs/sets.json")
    p.add_argument("--description", help="description of your own set (stored in its metadata)")
    p.add_argument("--cache-dir", metavar="DIR",
                   help="deprecated: rewrites in DIR are read and copied into the home; new ones go to the home "
                        "(use --home)")
    p.add_argument("--base-url", default=DEFAULT_BASE_URL, help="any OpenAI-compatible endpoint (default: %(default)s)")
    p.add_argument("--model", default=DEFAULT_MODEL, help="the model that writes the rewrites (default: %(default)s)")
    p.add_argument("--fallback-model", help="asked when the model refuses, answers no JSON or keeps breaking rules")
    p.add_argument("--judge-model", help="the judge for --validate (default: --model)")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight at once (default: %(default)s)")
    p.add_argument("--attempts", type=int, default=3,
                   help="tries per model for an answer that breaks the rules (default: %(default)s)")
    p.add_argument("--retries", type=int, default=5,
                   help="retries on rate limits (429), 5xx and timeouts (default: %(default)s)")
    p.add_argument("--backoff", type=float, default=1.0,
                   help="first retry delay in seconds (doubles each retry) (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds per request (and for the download) (default: %(default)s)")
    p.add_argument("--no-json-mode", action="store_true", help="do not send response_format=json_object")
    p.add_argument("--limit", type=int, help="only the first N vignettes (smoke tests)")
    p.add_argument("--dry-run", action="store_true", help="show what would be requested; no key, nothing written")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--validate", action="store_true", help="ask a judge model about every text of the set")
    p.add_argument("--out", help="--validate results (JSONL; default ./validate_<name>.jsonl)")
    p.add_argument("--show", type=int, metavar="N",
                   help="spot check: print N random vignettes of a prepared set with their four conditions side by "
                        "side (and the judge's verdicts where --validate has run); reads local files only")
    p.add_argument("--seed", type=int, default=0, help="which vignettes --show draws (default: %(default)s)")
    return p


def option_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the options' values, or ``None``."""
    if args.limit is not None and args.limit <= 0:
        return "--limit must be a positive integer"
    if args.concurrency < 1 or args.attempts < 1 or args.retries < 0 or args.backoff < 0 or args.timeout <= 0:
        return "--concurrency and --attempts must be >= 1, --retries and --backoff >= 0, --timeout > 0"
    if args.home is not None and not args.home.strip():
        return "--home needs a folder"
    if args.show is not None:
        if args.show <= 0:
            return "--show must be a positive integer (how many vignettes to print)"
        clash = [o for o, on in (("--validate", args.validate), ("--source", args.source), ("--url", args.url),
                                 ("--dry-run", args.dry_run), ("--force-download", args.force_download)) if on]
        if clash:
            return (f"--show only reads what is prepared: run the step with {' '.join(clash)} first, then "
                    f"python -m tinymcf_callback.prepare --show N --name NAME without it")
    return None


def known_secrets() -> list[str]:
    """Every key value this process could use, so that no message can show one."""
    vals = [os.environ.get(v) for v in KEY_VARS]
    dot = read_dotenv(Path.cwd() / ".env")
    vals += [dot.get(v) for v in KEY_VARS]
    return [v.strip() for v in vals if v and v.strip()]


def run_cli(args: argparse.Namespace, command: Command) -> int:
    """Run ``command(args, secrets, say)`` in the home of ``--home``; errors become ``error: ...`` and status 2."""
    problem = option_problem(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    secrets = known_secrets()

    def say(msg: str) -> None:
        print(scrub(msg, secrets), flush=True)

    try:
        with using_home(args.home):
            if args.cache_dir:
                say(f"warning: --cache-dir is deprecated: new rewrites and judgements go to {folders().cache} "
                    f"(choose the home with --home DIR or {HOME_VAR}); what {args.cache_dir} already holds is "
                    f"read and the set's entries are copied into the home")
            return command(args, secrets, say)
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
