"""``tinymcf prepare --name NAME``: make a vignette set ready for the probe (once; offline after).

See :mod:`tinymcf_callback.prepare.pipeline`; the LLM options are shared with ``tinymcf validate``
(:func:`add_llm_options`). No message ever shows an API key.
"""

from __future__ import annotations

from ..apiclient import known_secrets, scrub
from ..errors import ConfigError
from ..prepare.llm import DEFAULT_BASE_URL, DEFAULT_MODEL
from .options import add_home

NAME = "prepare"
SUMMARY = "make a vignette set ready: download and check Clifford, or register your own and have it rewritten"


def add_llm_options(p) -> None:
    """The options of the requests to an LLM, shared by ``prepare`` and ``validate``."""
    llm = p.add_argument_group("the LLM (any OpenAI-compatible endpoint; the key from OPENROUTER_API_KEY, "
                               "OPENAI_API_KEY or ./.env)")
    llm.add_argument("--base-url", default=DEFAULT_BASE_URL, help="the endpoint (default: %(default)s)")
    llm.add_argument("--model", default=DEFAULT_MODEL, help="the model that writes the rewrites (default: %(default)s)")
    llm.add_argument("--fallback-model", help="asked when the model refuses, answers no JSON or keeps breaking rules")
    llm.add_argument("--concurrency", type=int, default=8, help="requests in flight at once (default: %(default)s)")
    llm.add_argument("--attempts", type=int, default=3,
                     help="tries per model for an answer that breaks the rules (default: %(default)s)")
    llm.add_argument("--retries", type=int, default=5,
                     help="retries on rate limits (429), 5xx and timeouts (default: %(default)s)")
    llm.add_argument("--backoff", type=float, default=1.0,
                     help="first retry delay in seconds (doubles each retry) (default: %(default)s)")
    llm.add_argument("--timeout", type=float, default=60.0,
                     help="seconds per request (and for the download) (default: %(default)s)")
    llm.add_argument("--no-json-mode", action="store_true", help="do not send response_format=json_object")
    p.add_argument("--name", required=True, help="the set: clifford, or a name for your own set")
    p.add_argument("--limit", type=int, help="only the first N vignettes (smoke tests)")
    p.add_argument("--dry-run", action="store_true", help="show what would be requested; no key, nothing written")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_home(p)


def add_arguments(p) -> None:
    p.add_argument("--source", help="a local copy of the Clifford CSV, or your own scenarios (.csv or .jsonl)")
    p.add_argument("--url", help="download from this URL instead of the one in configs/sets.json")
    p.add_argument("--force-download", action="store_true", help="download again even if a verified copy exists")
    p.add_argument("--allow-checksum-change", action="store_true",
                   help="accept a downloaded file whose sha256 differs from configs/sets.json")
    p.add_argument("--description", help="description of your own set (stored in its metadata)")
    add_llm_options(p)


def check_llm_options(args) -> None:
    """One message per bad number, before anything is read or requested."""
    if args.limit is not None and args.limit <= 0:
        raise ConfigError(f"--limit must be a positive whole number of vignettes, got {args.limit}")
    if args.concurrency < 1 or args.attempts < 1 or args.retries < 0 or args.backoff < 0 or args.timeout <= 0:
        raise ConfigError("--concurrency and --attempts must be >= 1, --retries and --backoff >= 0, --timeout > 0")


class Say:
    """Prints a line with every known secret scrubbed out (what the prepare-side commands report with)."""

    def __init__(self):
        self.secrets = known_secrets()

    def __call__(self, msg: str) -> None:
        print(scrub(msg, self.secrets), flush=True)

    def scrub(self, text: str) -> str:
        return scrub(text, self.secrets)


def run(args) -> int:
    from ..prepare.pipeline import run_prepare

    check_llm_options(args)
    say = Say()
    return run_prepare(args, say.secrets, say)
