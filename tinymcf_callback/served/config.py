"""One configuration of a served model, built once from the options and read by everything that scores through it
(``tinymcf eval/sweep/watch --endpoint``, ``MoralProbeCallback(endpoint=...)``, ``ServedModel(...)``). It is checked
once, where it is made, and each bad value is named by its option.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..apiclient import ApiError, split_url
from ..errors import ServedError
from .forms import FORMS

N_CHECKED = 4  # prompts the self-check asks again per probe
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_RETRIES = 4
DEFAULT_BATCH = 4  # prompts per request where the server takes a list of them (echo: 1 prompt, all its answer tokens)
RELOAD_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class ServedConfig:
    """How a model in an inference server is scored (see the module); every field has the option of its name.

    Attributes:
        endpoint: the server's URL (``http://host:port``; a trailing ``/v1`` is fine) (``--endpoint``).
        model: the name the server serves the model under (``--model`` / ``--served-model``; None: the one it lists).
        form: the request form, ``auto`` for the server's exact one (``--form``).
        concurrency: requests in flight at once (``--concurrency``; None: about 8 sequences in flight, 1 request on
            llama.cpp).
        batch: prompts per request where the server takes a list of them (``--batch-prompts``; None: 4, and 1 for
            echo, whose request carries each of the prompt's answer tokens).
        timeout, retries: per request (``--request-timeout``, ``--request-retries``).
        top: how many top tokens a top-k form asks for (None: llama.cpp ``n_probs`` 1000, ``top_logprobs`` 20).
        check_prompts: prompts the self-check asks again per probe (0: none).
        check_form: the self-check's second form (``--check-form``; ``auto``: another route through the server than
            the scoring's, echo where that is logprob_token_ids or token_ids_logprob).
        tolerance: what the self-check holds the server's two readings of a prompt to (None: the probe's
            ``self_check_tolerance``, else 1e-3).
        seed: the seed of the rotation of checked prompts (None: the probe's ``seed``).
        reference: local weights (a folder or Hub id) to score the checked prompts with too (``--reference``).
        reference_tolerance: what the local forward pass's difference is held to (None: recorded only).
        reload: a shell command that loads a checkpoint into the server (``--reload``; sweep and watch).
        reload_timeout: seconds ``reload`` may take.
        reload_check: after each reload, check the server's answers to a few prompts against the checkpoint's own
            forward pass, loaded by the follower in float32 (:mod:`~tinymcf_callback.served.verify`;
            ``--no-reload-check`` for a model the follower cannot load); ``reference_tolerance`` overrides what they
            are held to.
    """

    endpoint: str
    model: str | None = None
    form: str = "auto"
    concurrency: int | None = None
    batch: int | None = None
    timeout: float = DEFAULT_TIMEOUT_S
    retries: int = DEFAULT_RETRIES
    top: int | None = None
    check_prompts: int = N_CHECKED
    check_form: str = "auto"
    tolerance: float | None = None
    seed: int | None = None
    reference: str | None = None
    reference_tolerance: float | None = None
    reload: str | None = None
    reload_timeout: float = RELOAD_TIMEOUT_S
    reload_check: bool = True

    def __post_init__(self):
        try:
            split_url(self.endpoint)
        except ApiError as e:
            raise ServedError(str(e)) from None
        for option, value in (("--form", self.form), ("--check-form", self.check_form)):
            if value != "auto" and value not in FORMS:
                raise ServedError(f"{option} must be auto or one of {', '.join(FORMS)}, got {value!r}")
        if self.model is not None and (not isinstance(self.model, str) or not self.model):
            raise ServedError(f"--model must name the served model (GET <endpoint>/v1/models lists them), got "
                              f"{self.model!r}")
        for option, value, least in (("--concurrency", self.concurrency, 1), ("--batch-prompts", self.batch, 1),
                                     ("--request-retries", self.retries, 0), ("--top", self.top, 1)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
                raise ServedError(f"{option} must be a whole number >= {least}, got {value!r}")
        if isinstance(self.check_prompts, bool) or not isinstance(self.check_prompts, int) or self.check_prompts < 0:
            raise ServedError(f"check_prompts must be a whole number >= 0, got {self.check_prompts!r}")
        for option, value in (("--request-timeout", self.timeout), ("--reload-timeout", self.reload_timeout)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ServedError(f"{option} must be a number of seconds above 0, got {value!r}")
        for option, value in (("--self-check-tolerance", self.tolerance),
                              ("--reference-tolerance", self.reference_tolerance)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
                raise ServedError(f"{option} must be a number >= 0, got {value!r}")

    def replace(self, **changes) -> ServedConfig:
        """A copy with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)

    @property
    def shown(self) -> str:
        """The endpoint without any user:password (what messages and reports show)."""
        return split_url(self.endpoint)[1]
