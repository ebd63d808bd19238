"""The LLM client's small parts: strict JSON answers and the ``.env`` reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from tinymcf_callback.apiclient import read_dotenv
from tinymcf_callback.prepare.llm import Answer, find_api_key, parse_json_answer

pytestmark = pytest.mark.usefixtures("clean_env")
ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- small parts


def test_parse_json_answer_is_strict():
    assert parse_json_answer(Answer("m", '{"rewrite": "You see a."}'))[0] == {"rewrite": "You see a."}
    assert parse_json_answer(Answer("m", '```json\n{"rewrite": "You see a."}\n```'))[0] == {"rewrite": "You see a."}
    obj, why = parse_json_answer(Answer("m", 'Sure! Here it is: {"rewrite": "You see a."}'))
    assert obj is None and why.startswith("unparseable")
    assert parse_json_answer(Answer("m", "I'm sorry, I can't help with that."))[1].startswith("refused")
    assert parse_json_answer(Answer("m", None, refusal="no"))[1].startswith("refused")
    assert parse_json_answer(Answer("m", "[1, 2]"))[1].startswith("unparseable")
    assert parse_json_answer(Answer("m", ""))[1] == "empty answer"


def test_read_dotenv(tmp_path):
    p = tmp_path / ".env"
    p.write_text('A=1\n# c\nexport B="two words"\nC=x # note\n\nbroken\n')
    assert read_dotenv(p) == {"A": "1", "B": "two words", "C": "x"}
    assert find_api_key({"OPENAI_API_KEY": "k1"}, tmp_path) == ("k1", "$OPENAI_API_KEY")
    assert find_api_key({}, tmp_path) == (None, None)
