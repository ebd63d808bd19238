"""The run folders of RL trainers and plain loops, made by the same save calls the trainers make
(tests/helpers/rl_folders.py): verl's per-rank FSDP shards (written by two processes over gloo), OpenRLHF's
``global_step<N>_hf``, NeMo-RL's torch distributed checkpoint renamed from ``tmp_step_<N>``, torchtitan's DCP
``step-<N>`` under its own parameter names (Llama 3 and Qwen3) and its safetensors export, and ``save_pretrained``
step folders. The sweep and the watcher find the layout, say which in one line, read only complete saves by one
rule, and score each save as ``tinymcf eval`` scores the same weights (within 1e-5, float32).

Tiny random models: mechanics only. The rules of completeness are checked on folders of files alone (fast); the
scores, which load and probe models, are slow.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
import torch
from helpers import rl_folders
from helpers.runs import history

from tinymcf_callback.cli.main import main as tinymcf
from tinymcf_callback.errors import RegistryError
from tinymcf_callback.follow import sharded
from tinymcf_callback.rundir import layouts
from tinymcf_callback.rundir.checkpoints import FORMATS, Checkpoint, Format, fingerprint, weight_files
from tinymcf_callback.rundir.layouts import find_saves, read_save

PROBE = ["--limit", "2", "--n-resamples", "0", "--no-progress", "--device", "cpu"]
EVAL_AGREES = 1e-5
OLD = time.time() - 3600  # a file time an hour ago: steady by any --settle


def tiny_llama(seed: int = 0):
    import transformers as T

    torch.manual_seed(seed)
    config = T.LlamaConfig(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    return T.LlamaForCausalLM(config).eval()


def age(folder: Path, when: float = OLD) -> None:
    """Every file under ``folder`` as if written at ``when`` (a save long finished)."""
    for root, _, files in os.walk(folder):
        for name in files:
            os.utime(Path(root) / name, (when, when))


# ---- which folders there are, and which are complete: files only ----------------------------------------------
@pytest.fixture(scope="module")
def small():
    """A small model (2 MB: two 1 MB shards) and the real tokenizer: the layouts' files, quickly."""
    import transformers as T

    from tinymcf_callback.testing import qwen3_tokenizer_dir

    torch.manual_seed(0)
    model = T.LlamaForCausalLM(T.LlamaConfig(vocab_size=4096, hidden_size=64, intermediate_size=16, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=1))
    return model, T.AutoTokenizer.from_pretrained(qwen3_tokenizer_dir())


def test_each_layout_is_found_by_its_folder_names_and_what_they_hold(tmp_path, small):
    model, tok = small
    made = {
        layouts.OPENRLHF: lambda run: rl_folders.openrlhf_save(run, 5, model, tok),
        layouts.NEMO_RL: lambda run: rl_folders.nemo_rl_save(run, 5, model, tok),
        layouts.TORCHTITAN: lambda run: rl_folders.torchtitan_save(run, 5, model, family="llama"),
        layouts.PLAIN: lambda run: rl_folders.plain_save(run, 5, model, tok),
    }
    for layout, make in made.items():
        run = tmp_path / layout
        folder = make(run)
        found = find_saves(run)
        assert (found.layout, list(found.saves)) == (layout, [5]), layout
        assert found.saves[5] == folder or found.saves[5] == folder.parent, layout
    assert find_saves(tmp_path / "nothing").layout is None


def test_nemo_rls_unfinished_step_is_never_a_save(tmp_path, small):
    model, tok = small
    rl_folders.nemo_rl_unfinished(tmp_path, 7, model, tok)
    assert find_saves(tmp_path).saves == {}  # tmp_step_7: not even listed (it is not a step folder yet)
    rl_folders.nemo_rl_save(tmp_path, 8, model, tok)
    found = find_saves(tmp_path)
    assert list(found.saves) == [8] and read_save(found.layout, 8, found.saves[8], tmp_path).format == "dcp"


def test_a_save_pretrained_folder_counts_once_whole_and_steady(tmp_path, small):
    model, tok = small
    folder = rl_folders.plain_save(tmp_path, 3, model, tok, shards=True)
    assert read_save(layouts.PLAIN, 3, folder, tmp_path, settle=5.0) is None  # just written: not steady yet
    age(folder)
    assert read_save(layouts.PLAIN, 3, folder, tmp_path, settle=5.0).format == "full"
    shard = sorted(folder.glob("model-0000*.safetensors"))[-1]
    shard.rename(shard.with_suffix(".part"))  # a shard the index names is missing: not whole
    assert read_save(layouts.PLAIN, 3, folder, tmp_path, settle=0.0) is None


def test_openrlhf_counts_once_its_tokenizer_the_last_write_is_there(tmp_path, small):
    model, tok = small
    folder = rl_folders.openrlhf_save(tmp_path, 4, model, tok)
    age(folder)
    assert read_save(layouts.OPENRLHF, 4, folder, tmp_path, settle=1.0) is not None
    (folder / "tokenizer_config.json").unlink()
    assert read_save(layouts.OPENRLHF, 4, folder, tmp_path, settle=1.0) is None


def test_torchtitan_counts_once_its_metadata_the_last_write_is_there(tmp_path, small):
    model, _ = small
    folder = rl_folders.torchtitan_save(tmp_path, 9, model, family="llama")
    assert read_save(layouts.TORCHTITAN, 9, folder, tmp_path).format == "dcp"
    (folder / ".metadata").rename(folder / ".metadata.tmp")  # DCP writes it last (a rename of this)
    assert read_save(layouts.TORCHTITAN, 9, folder, tmp_path) is None


def test_a_sweep_says_which_layout_it_found_and_the_saves_it_leaves_for_later(tmp_path, small, capsys):
    model, tok = small
    rl_folders.plain_save(tmp_path, 3, model, tok)  # just written: not steady for the default 5 s
    rc = tinymcf(["sweep", str(tmp_path), *PROBE, "--no-baseline"])
    err = capsys.readouterr().err
    assert rc == 0 and layouts.LAYOUTS[layouts.PLAIN].described in err
    assert "step_3" in err  # left for a later sweep, named
    assert not (tmp_path / "moral_probe_scifi.jsonl").exists()


# ---- each layout scored as eval scores the same weights (slow: models load and are probed) -------------------
def evals(tmp_path: Path, models: dict[int, torch.nn.Module], tok) -> dict[int, dict]:
    """``tinymcf eval`` of each step's weights, saved as a plain model folder."""
    out = {}
    for step, model in models.items():
        folder = tmp_path / "reference" / f"step{step}"
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
        assert tinymcf(["eval", "--model", str(folder), *PROBE, "--out", str(tmp_path / "reference"), "--tag",
                        f"s{step}"]) == 0
        out[step] = json.loads((tmp_path / "reference" / f"eval_scifi_s{step}.json").read_text())
    return out


def same_as_eval(line: dict, report: dict) -> None:
    assert line["prompt_digest"] == report["prompt_digest"]
    for key in ("score", "gap"):
        assert line[key] == pytest.approx(report[key], abs=EVAL_AGREES), key
    for mine, theirs in zip(line["table"], report["table"], strict=True):
        for col in ("align_other", "align_self", "s_other_violate", "s_self_uphold"):
            assert mine[col] == pytest.approx(theirs[col], abs=EVAL_AGREES), (mine["foundation"], col)


LAYOUT_CASES = {
    "verl": (lambda run, step, m, tok: rl_folders.verl_save(run, step, m, tok), False, "qwen3"),
    "verl hf weights": (lambda run, step, m, tok: rl_folders.verl_save(run, step, m, tok, hf_weights=True), False,
                        "qwen3"),
    "openrlhf": (lambda run, step, m, tok: rl_folders.openrlhf_save(run, step, m, tok), False, "qwen3"),
    "nemo-rl": (lambda run, step, m, tok: rl_folders.nemo_rl_save(run, step, m, tok), True, "qwen3"),
    "torchtitan qwen3": (lambda run, step, m, tok: rl_folders.torchtitan_save(run, step, m, family="qwen3"), True,
                         "qwen3"),
    "torchtitan llama": (lambda run, step, m, tok: rl_folders.torchtitan_save(run, step, m, family="llama"), True,
                         "llama"),
    "torchtitan export": (lambda run, step, m, tok: rl_folders.torchtitan_hf_export(run, step, m), True, "qwen3"),
    "plain": (lambda run, step, m, tok: rl_folders.plain_save(run, step, m, tok, shards=True), False, "qwen3"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(LAYOUT_CASES))
def test_each_layout_is_scored_as_eval_scores_the_same_weights(tmp_path, qwen_tok, case, capsys):
    from tinymcf_callback.testing import tiny_qwen3

    make, needs_base, family = LAYOUT_CASES[case]
    build = tiny_qwen3 if family == "qwen3" else tiny_llama
    models = {10: build(seed=1), 20: build(seed=2)}
    run, base = tmp_path / "run", tmp_path / "base"
    build(seed=0).save_pretrained(base)  # the run's starting model: the architecture a DCP checkpoint lacks
    qwen_tok.save_pretrained(base)
    for step, model in models.items():
        make(run, step, model, qwen_tok)
    age(run)
    reference = evals(tmp_path, models, qwen_tok)
    capsys.readouterr()
    rc = tinymcf(["sweep", str(run), *PROBE, "--base-model", str(base), "--no-baseline"])
    err = capsys.readouterr().err
    assert rc == 0, err
    lines = history(run)
    assert [line["step"] for line in lines] == [10, 20]
    for line in lines:
        same_as_eval(line, reference[line["step"]])
        assert line["fingerprint"] is not None
    assert f"holds {layouts.LAYOUTS[find_saves(run).layout].described}" in err
    assert needs_base == read_save(find_saves(run).layout, 10, find_saves(run).saves[10], run).needs_base
    # the watcher reads the same folders the same way: nothing left to score, and it does not wait for a run to start
    watched = tinymcf(["watch", str(run), *PROBE, "--base-model", str(base), "--no-baseline", "--poll", "0.05",
                       "--stop-at", "20", "--report-to", "none"])
    assert watched == 0 and len(history(run)) == 2


@pytest.mark.slow
def test_verl_without_its_tracker_counts_once_every_rank_is_there_and_steady(tmp_path, small):
    """verl with ``async_save`` writes no latest_checkpointed_iteration.txt: the rank shards decide."""
    model, tok = small
    actor = rl_folders.verl_save(tmp_path, 6, model, tok, tracker=False)
    assert read_save(layouts.VERL, 6, actor, tmp_path, settle=5.0) is None  # just written
    age(actor)
    assert read_save(layouts.VERL, 6, actor, tmp_path, settle=5.0).format == "verl-fsdp"
    (actor / "model_world_size_2_rank_1.pt").rename(actor / "rank_1.partial")  # a rank still writing
    assert read_save(layouts.VERL, 6, actor, tmp_path, settle=0.0) is None
    (actor / "rank_1.partial").rename(actor / "model_world_size_2_rank_1.pt")
    (tmp_path / layouts.VERL_TRACKER).write_text("6")  # the tracker names it: complete, however fresh
    age(actor, time.time())
    assert read_save(layouts.VERL, 6, actor, tmp_path, settle=5.0).format == "verl-fsdp"


# ---- a layout is one record: registered alone, the follower finds, reads, fingerprints and loads its saves --------
TOY_NAME = re.compile(r"policy_v(\d+)")
TOY_FORMAT = "toy-state-dict"


def toy_save(run: Path, step: int, model, tok) -> Path:
    """A made-up RL trainer's save: ``policy_v<N>/`` with the config, the tokenizer, the state dict in one
    ``weights.pt``, and ``SAVED`` written last."""
    folder = run / f"policy_v{step}"
    folder.mkdir(parents=True)
    model.config.save_pretrained(folder)
    tok.save_pretrained(folder)
    torch.save(model.state_dict(), folder / "weights.pt")
    (folder / "SAVED").write_text("")
    return folder


def _read_toy(save: layouts.Save) -> Checkpoint | None:
    if not (save.folder / "SAVED").is_file():
        return None
    return Checkpoint(save.step, save.folder, None, TOY_FORMAT)


def _load_toy(checkpoint: Checkpoint, base_model, *, dtype: str, device: str):
    model = sharded.empty_model(str(checkpoint.folder), dtype)
    model.load_state_dict(torch.load(checkpoint.folder / "weights.pt", map_location="cpu"))
    return model.eval().to(device)


@pytest.fixture
def toy_layout():
    """The made-up trainer's layout: one record (its saves hold a format of their own, whose record brings its
    loader), registered for the test only (the tables' own scoped registration)."""
    form = Format(TOY_FORMAT, lambda folder: [folder / "weights.pt"] if (folder / "weights.pt").is_file() else [],
                  _load_toy)
    with layouts.LAYOUTS.scoped(), FORMATS.scoped():
        yield layouts.register_layout(layouts.Layout("toyrl", "toyrl policy_v<N> folders",
                                                     layouts.named_saves(TOY_NAME), _read_toy, formats=(form,)))
    assert "toyrl" not in layouts.LAYOUTS and TOY_FORMAT not in FORMATS


def test_a_registered_layout_is_found_read_and_fingerprinted_by_its_record_alone(tmp_path, small, toy_layout):
    model, tok = small
    assert list(layouts.LAYOUTS)[-2:] == ["toyrl", layouts.PLAIN]  # tried before the catch-all
    folder = toy_save(tmp_path, 5, model, tok)
    found = find_saves(tmp_path)
    assert (found.layout, found.saves) == ("toyrl", {5: folder})
    assert find_saves(tmp_path).described == "toyrl policy_v<N> folders"
    checkpoint = read_save("toyrl", 5, folder, tmp_path)
    assert checkpoint.format == TOY_FORMAT and weight_files(folder, TOY_FORMAT) == [folder / "weights.pt"]
    assert fingerprint(folder, TOY_FORMAT) is not None
    (folder / "SAVED").unlink()  # the trainer's last write not there yet: not complete
    assert read_save("toyrl", 5, folder, tmp_path) is None
    with pytest.raises(RegistryError, match="'toyrl'"):
        layouts.register_layout(toy_layout)


@pytest.mark.slow
def test_a_registered_layout_is_scored_by_the_sweep_as_eval_scores_the_same_weights(tmp_path, qwen_tok, toy_layout,
                                                                                     capsys):
    from tinymcf_callback.testing import tiny_qwen3

    models = {10: tiny_qwen3(seed=1), 20: tiny_qwen3(seed=2)}
    run = tmp_path / "run"
    for step, model in models.items():
        toy_save(run, step, model, qwen_tok)
    reference = evals(tmp_path, models, qwen_tok)
    capsys.readouterr()
    rc = tinymcf(["sweep", str(run), *PROBE, "--no-baseline"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "holds toyrl policy_v<N> folders" in err
    lines = history(run)
    assert [line["step"] for line in lines] == [10, 20]
    for line in lines:
        same_as_eval(line, reference[line["step"]])
        assert line["fingerprint"] == fingerprint(run / f"policy_v{line['step']}", TOY_FORMAT)
