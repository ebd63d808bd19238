"""The served backend's parts without a server: each request form as a payload/parse pair, the transport's batching,
order and cancellation, the checks before scoring, and the configuration built once from the options.

No HTTP here: the forms are fed answers written the way vLLM, SGLang and llama.cpp answer (the fake server of
test_served.py and the real ones of tests/servers/ send the same shapes), and the transport a client that records
what it was asked.
"""

from __future__ import annotations

import math
import threading

import pytest
from helpers.cli_checks import names

from tinymcf_callback.errors import ServedError
from tinymcf_callback.served import ServedConfig
from tinymcf_callback.served.forms import FORM_CLASSES, PINS, Echo, LogprobTokenIds, NProbs, Reading, TokenIdsLogprob
from tinymcf_callback.served.server import Server, check_logprobs
from tinymcf_callback.served.transport import Transport, batches

YES, NO = [9454, 9693], [2753, 902]  # two spellings of each answer
A, B = [1, 2, 3], [1, 2, 4, 5]  # two prompts' token ids


def form(cls, **kw):
    return cls("m", (YES, NO), top=kw.pop("top", 5), vocab={"Yes": 9454, "No": 2753}, vocab_size=100_000,
               pins=kw.pop("pins", PINS["vllm"]), **kw)


def completion(choices: list[dict]) -> dict:
    return {"object": "text_completion", "choices": [{"index": i, **c} for i, c in enumerate(choices)]}


# ---- every form: the payload pins the sampling settings and carries the token ids -------------------------------
@pytest.mark.parametrize("name", sorted(FORM_CLASSES))
def test_every_payload_pins_the_sampling_settings_and_sends_token_ids(name):
    f = form(FORM_CLASSES[name])
    body = f.payload([A])
    sampling = body.get("sampling_params", body)
    assert {k: sampling[k] for k in PINS["vllm"]} == PINS["vllm"]  # temperature 1, no cut, no penalty
    assert f.payload([A], temperature=0.5).get("sampling_params", f.payload([A], temperature=0.5))[
        "temperature"] == 0.5  # the check's second reading
    prompt = body.get("prompt", body.get("input_ids"))
    first = prompt[0] if name == "echo" else prompt  # echo: a sequence per answer token
    assert first[:3] == A and all(isinstance(t, int) for t in first)  # the prompt's token ids, never text


def test_a_plain_server_gets_only_the_openai_apis_own_sampling_parameters():
    body = form(Echo, pins=PINS["openai-compatible"]).payload([A])
    assert "top_k" not in body and "min_p" not in body and body["temperature"] == 1.0 and body["top_p"] == 1.0


# ---- vLLM: logprob_token_ids ------------------------------------------------------------------------------------
def test_logprob_token_ids_asks_for_every_answer_id_of_several_prompts_in_one_request():
    f = form(LogprobTokenIds)
    body = f.payload([A, B])
    assert body["prompt"] == [A, B] and body["logprob_token_ids"] == YES + NO and body["max_tokens"] == 1
    row = {f"token_id:{t}": -1.0 - t / 1e4 for t in YES + NO}
    answer = completion([{"logprobs": {"top_logprobs": [dict(row, **{"token_id:7": -0.5})]}},
                         {"logprobs": {"top_logprobs": [row]}}])
    readings = f.parse(answer, [A, B])
    assert [r.logp for r in readings] == [{t: -1.0 - t / 1e4 for t in YES + NO}] * 2
    answer["choices"].reverse()  # the server's order is its own: the index says which prompt
    assert [r.logp for r in f.parse(answer, [A, B])] == [r.logp for r in readings]


def test_logprob_token_ids_refuses_an_answer_without_them_and_a_wrong_number_of_choices():
    f = form(LogprobTokenIds)
    older = completion([{"logprobs": {"top_logprobs": [{"token_id:7": -0.5}]}}])  # a server that ignored them
    with pytest.raises(ServedError) as refused:
        f.parse(older, [A])
    names(refused.value, "logprob_token_ids", "--form echo")
    with pytest.raises(ServedError) as refused:
        f.parse(older, [A, B])
    names(refused.value, "1 choice", "2 prompt")
    with pytest.raises(ServedError, match="0 choice"):
        f.parse({"choices": [{"index": 0, "logprobs": None}]}, [A])


def test_minus_9999_is_minus_infinity():
    row = {f"token_id:{t}": -9999.0 for t in YES + NO}
    [reading] = form(LogprobTokenIds).parse(completion([{"logprobs": {"top_logprobs": [row]}}]), [A])
    assert all(v == -math.inf for v in reading.logp.values())


# ---- SGLang: token_ids_logprob ----------------------------------------------------------------------------------
def test_sglang_takes_a_batch_of_input_ids_and_answers_a_list():
    f = form(TokenIdsLogprob, pins=PINS["sglang"])
    body = f.payload([A, B])
    assert body["input_ids"] == [A, B] and body["token_ids_logprob"] == YES + NO
    assert body["sampling_params"]["top_k"] == -1 and body["sampling_params"]["max_new_tokens"] == 1

    def one(shift):
        return {"meta_info": {"output_token_ids_logprobs": [[[-1.0 - shift, t, None] for t in YES + NO]],
                              "output_top_logprobs": [[[-0.1, 42, None], [-1.0 - shift, YES[0], None]]]}}

    readings = f.parse([one(0.0), one(1.0)], [A, B])
    assert [r.logp[YES[0]] for r in readings] == [-1.0, -2.0] and readings[0].top[0] == (42, -0.1)
    assert f.parse(one(0.0), [A])[0].logp[NO[1]] == -1.0  # one prompt: one answer, not a list
    with pytest.raises(ServedError) as refused:
        f.parse([one(0.0)], [A, B])
    names(refused.value, "1 answer", "/generate", "2 prompt")


# ---- llama.cpp: n_probs ------------------------------------------------------------------------------------------
def test_n_probs_reads_one_prompt_and_asks_again_for_the_whole_vocabulary_when_an_answer_is_below_the_top_k():
    f = form(NProbs, pins=PINS["llama.cpp"], top=3)
    assert not f.batched and f.payload([A])["prompt"] == A and f.payload([A])["n_probs"] == 3
    assert f.payload([A], whole=True)["n_probs"] == 100_000 and f.payload([A])["post_sampling_probs"] is False
    listed = [{"id": 42, "logprob": -0.1}, {"id": YES[0], "logprob": -1.0}, {"id": NO[0], "logprob": -2.0}]
    [reading] = f.parse({"completion_probabilities": [{"top_logprobs": listed}]}, [A])
    assert reading.logp == {YES[0]: -1.0, NO[0]: -2.0} and reading.floor == -2.0
    assert f.incomplete(reading)  # YES[1] and NO[1] are below the top 3: their mass is not known
    [whole] = f.parse({"completion_probabilities": [{"top_logprobs": listed}]}, [A], whole=True)
    assert whole.floor is None and not f.incomplete(whole)  # fewer than the vocabulary: every other token is 0


# ---- echo: one sequence per (prompt, answer token), many per request --------------------------------------------
def test_echo_sends_each_prompt_with_each_answer_token_and_reads_the_last_position_back():
    f = form(Echo)
    body = f.payload([A, B])
    assert body["echo"] is True and body["prompt"] == [[*p, t] for p in (A, B) for t in YES + NO]
    choices = []
    for p in (A, B):
        for t in YES + NO:
            values = [None] + [-0.5] * (len(p) - 1) + [-1.0 - t / 1e4 - len(p), -0.3]
            choices.append({"logprobs": {"tokens": [f"token_id:{x}" for x in [*p, t, 7]], "token_logprobs": values,
                                         "top_logprobs": [None] * len(values)}})
    readings = f.parse(completion(choices), [A, B])
    assert readings[0].logp == {t: -1.0 - t / 1e4 - 3 for t in YES + NO}
    assert readings[1].logp == {t: -1.0 - t / 1e4 - 4 for t in YES + NO}
    only = f.payload([A], only=[YES[0], NO[0]])  # the self-check's second form: the likeliest Yes and No only
    assert only["prompt"] == [[*A, YES[0]], [*A, NO[0]]]


def test_echo_refuses_a_server_that_re_tokenized_the_prompt_or_echoed_nothing():
    f = form(Echo)
    retokenized = completion([{"logprobs": {"tokens": ["token_id:1", "token_id:2", "token_id:3", "token_id:99"],
                                            "token_logprobs": [None, -1, -1, -1]}}])
    with pytest.raises(ServedError) as refused:
        f.parse(retokenized, [A], only=[YES[0]])
    names(refused.value, "'token_id:99'", "9454")  # what came back, what was sent
    silent = completion([{"logprobs": {"tokens": [], "token_logprobs": [-0.3]}}])
    with pytest.raises(ServedError, match="echo"):
        f.parse(silent, [A], only=[YES[0]])


# ---- the transport ------------------------------------------------------------------------------------------------
class RecordingClient:
    """What a transport sends, without HTTP: each body, and an answer made from it (a vLLM completion)."""

    shown = "fake://server"

    def __init__(self, fail_at: int | None = None):
        self.bodies: list[dict] = []
        self.fail_at, self.closed = fail_at, False
        self.lock = threading.Lock()

    def post(self, route, body, retries=None):
        with self.lock:
            self.bodies.append(body)
            n = len(self.bodies)
        if self.fail_at is not None and n >= self.fail_at:
            raise ServedError("the server at fake://server kept failing on /v1/completions (503) after 5 tries")
        prompts = body["prompt"] if isinstance(body["prompt"][0], list) else [body["prompt"]]
        row = lambda p: {f"token_id:{t}": -float(len(p)) for t in YES + NO}  # noqa: E731
        return completion([{"logprobs": {"top_logprobs": [row(p)]}} for p in prompts])

    def close(self):
        self.closed = True


def test_batches_hold_at_most_size_prompts_and_one_where_the_form_takes_one():
    keyed = [(i, [1, i]) for i in range(10)]
    asks = batches(form(LogprobTokenIds), keyed, 4)
    assert [a.keys for a in asks] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert [len(a.keys) for a in batches(form(NProbs), keyed, 4)] == [1] * 10  # llama.cpp: one at a time


def test_the_transport_sends_in_order_and_returns_every_reading_by_its_key():
    client = RecordingClient()
    asks = batches(form(LogprobTokenIds), [(("main", i), [5] * (i + 1)) for i in range(7)], 3)
    readings = Transport(client, concurrency=1).run(asks)
    assert [len(b["prompt"]) if isinstance(b["prompt"][0], list) else 1 for b in client.bodies] == [3, 3, 1]
    assert sorted(readings) == [("main", i) for i in range(7)]
    assert all(readings[("main", i)].logp[YES[0]] == -(i + 1) for i in range(7))  # each its own prompt's


def test_a_request_that_fails_for_good_stops_the_rest_and_closes_the_connections():
    client = RecordingClient(fail_at=2)
    asks = batches(form(LogprobTokenIds), [(i, [5, i]) for i in range(40)], 1)
    with pytest.raises(ServedError, match="kept failing"):
        Transport(client, concurrency=2).run(asks)
    assert len(client.bodies) < 10 and client.closed  # the rest were never sent; what was in flight is dropped


@pytest.mark.parametrize("fail_at", [1, 3])
def test_after_a_failed_request_not_one_more_is_sent_however_the_threads_are_scheduled(fail_at):
    # the worker that failed would take the next ask before the pool was shut down: one request more, seen under load
    for _ in range(20):
        client = RecordingClient(fail_at=fail_at)
        with pytest.raises(ServedError, match="kept failing"):
            Transport(client, concurrency=1).run(batches(form(LogprobTokenIds), [(i, [5, i]) for i in range(30)], 1))
        assert len(client.bodies) == fail_at


def test_p_yes_is_read_in_log_space_on_every_path_and_stays_defined_when_the_masses_underflow(qwen_tok):
    import torch

    from tinymcf_callback.scoring.answers import score_prompts
    from tinymcf_callback.scoring.prompts import answer_token_ids
    from tinymcf_callback.served.answers import answer

    yes, no = answer_token_ids(qwen_tok)
    cases = [(-800.0, -801.0), (-1.0, -2.0), (-3.0, -math.inf)]  # exp(-800) underflows to 0 even in float64
    logits = torch.full((len(cases), len(qwen_tok)), -math.inf)
    logits[:, 0] = 0.0
    for row, (y, n) in enumerate(cases):
        logits[row, yes[0]], logits[row, no[0]] = y, n
    local = score_prompts(logits, qwen_tok)
    assert local.p_yes[0] == pytest.approx(1 / (1 + math.exp(-1)), abs=1e-7) and local.p_yes[2] == 1.0
    logp = torch.log_softmax(logits, dim=-1)
    for row in range(len(cases)):
        served = Reading(logp={t: float(logp[row, t]) for t in (*yes, *no)})  # what a server answers: log-probs
        p_yes, mass = answer(served, yes, no)
        assert p_yes == pytest.approx(local.p_yes[row], abs=1e-7) and mass == pytest.approx(local.yn_mass[row])
    assert math.isnan(answer(Reading(logp={}), yes, no)[0])  # no answer read at all: undefined, not 0


# ---- the checks before scoring ------------------------------------------------------------------------------------
def test_numbers_that_move_with_the_temperature_are_processed_and_repeat_noise_is_not():
    r = lambda y: Reading({YES[0]: y, NO[0]: -1.0})  # noqa: E731
    assert check_logprobs((r(-1.0), r(-1.0), r(-1.0))).mode == "raw"
    assert check_logprobs((r(-1.0), r(-2.0), r(-1.0))).mode == "processed"
    noisy = check_logprobs((r(-1.0), r(-1.05), r(-1.01)))  # moved 0.05, but the repeat alone moved 0.01
    assert noisy.mode == "raw" and noisy.noise == pytest.approx(0.01)


def test_a_vllm_lora_server_lists_its_adapters_with_their_base():
    assert Server("vllm", adapters={"policy-lora": "base"}).lora and not Server("vllm").lora


# ---- one configuration --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("change, needle", [
    ({"endpoint": "localhost:8000"}, "not an http"), ({"form": "logits"}, "--form must be auto or one of"),
    ({"concurrency": 0}, "--concurrency must be a whole number >= 1"), ({"batch": 0}, "--batch-prompts"),
    ({"timeout": 0}, "--request-timeout must be a number of seconds above 0"), ({"retries": -1}, "--request-retries"),
    ({"tolerance": -1.0}, "--self-check-tolerance"),
])
def test_a_served_configuration_names_the_option_of_a_bad_value(change, needle):
    with pytest.raises(ServedError, match=needle):
        ServedConfig(**{"endpoint": "http://127.0.0.1:8000", "model": "m", **change})


def test_the_options_build_one_configuration_with_the_probes_seed_and_tolerance():
    from tinymcf_callback.cli.main import build_parser
    from tinymcf_callback.cli.options import probe_config, served_config

    args = build_parser().parse_args(["eval", "--model", "policy", "--endpoint", "http://h:1/v1", "--concurrency",
                                      "3", "--batch-prompts", "2", "--seed", "7", "--self-check-tolerance", "0.01"])
    config = served_config(args, probe_config(args))
    assert (config.model, config.concurrency, config.batch, config.seed, config.tolerance) == ("policy", 3, 2, 7, 0.01)
    run = build_parser().parse_args(["watch", "out", "--endpoint", "http://h:1", "--served-model", "policy",
                                     "--reload", "true", "--seed", "3"])
    config = served_config(run, probe_config(run), run=True)
    assert (config.model, config.reload, config.seed) == ("policy", "true", 3)
