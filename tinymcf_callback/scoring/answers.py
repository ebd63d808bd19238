"""The answer read off the logits: P(Yes) against No (P(true) against false) and the Yes+No mass.

Every Yes and No variant of the tokenizer counts (``" Yes"``, ``"Yes"``, ``"YES"``, ...: the
prompts' :func:`~tinymcf_callback.scoring.prompts.answer_token_ids`), so P(Yes) does not depend on
which spelling the model prefers; the mass says how much of the model's belief the answer is read from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .prompts import DEFAULT_ANSWER_FORMAT, answer_token_ids


@dataclass(frozen=True)
class AnswerScores:
    """Per-prompt ``p_yes`` and ``yn_mass`` (numpy arrays, float64), as :func:`score_prompts` returns them."""

    p_yes: np.ndarray
    yn_mass: np.ndarray


def score_prompts(logits, tok, answer_format: str = DEFAULT_ANSWER_FORMAT) -> AnswerScores:
    """Per-prompt ``p_yes`` (Yes against No only) and ``yn_mass`` (Yes+No over the vocabulary).

    ``logits``: ``[n_prompts, vocab]`` at the answer position (a tensor or an array).
    Every Yes and No variant of the tokenizer counts (see ``answer_token_ids``). With
    ``answer_format="json"`` the answers are true and false: ``p_yes`` is P(true) against
    false and ``yn_mass`` the true+false mass (the names stay, the roles are the same).
    Returns :class:`AnswerScores`: ``scored.p_yes``, ``scored.yn_mass``.
    """
    yes, no = answer_token_ids(tok, answer_format)
    logits = torch.as_tensor(logits)
    logp = torch.log_softmax(logits, dim=-1, dtype=torch.float32)  # read in float32 by the softmax itself, not copied
    p_yes, log_mass = yes_against_no(torch.logsumexp(logp[:, yes], dim=-1), torch.logsumexp(logp[:, no], dim=-1))
    return AnswerScores(p_yes.double().cpu().numpy(), log_mass.exp().double().cpu().numpy())


def yes_against_no(log_yes, log_no) -> tuple[torch.Tensor, torch.Tensor]:
    """``(P(Yes), log(Yes+No mass))`` from the log-probabilities of Yes and of No (each summed over its variants),
    in log space: every path (the local forward, a server's answers) reads P(Yes) here. ``sigmoid(log_yes - log_no)``
    stays defined when both masses underflow to 0 in probability space (two logs of -800 give 0.5, not 0/0); NaN
    only when neither answer was read at all (both ``-inf``). Tensors or numbers, in their own precision."""
    log_yes, log_no = torch.as_tensor(log_yes), torch.as_tensor(log_no)
    return torch.sigmoid(log_yes - log_no), torch.logaddexp(log_yes, log_no)
