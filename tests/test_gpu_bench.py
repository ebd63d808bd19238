"""``benchmarks/gpu.py --small``: the GPU benchmark's dry run on the CPU, so that a GPU session finds it working.

Every section of the real run runs here on a tiny model and one vignette a set: the methods of the issue's table
(the probe checked and unchecked, at the CPU's plan, the straightforward loop, lm-eval when it is installed), the
profiles, the first self-checks in bfloat16 and float16, and the callback in a Trainer; one JSON comes out.
"""

import json

import pytest

from benchmarks import gpu


@pytest.fixture
def clifford_prepared(generated_clifford):
    from tinymcf_callback.cli.main import main as tinymcf
    from tinymcf_callback.data.home import folders

    generated_clifford.install_rewrites(folders().cache)
    assert tinymcf(["prepare", "--name", "clifford", "--source", str(generated_clifford.path),
                    "--allow-checksum-change"]) == 0


@pytest.mark.usefixtures("one_thread", "clifford_prepared")
def test_the_gpu_benchmark_runs_on_the_cpu(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    assert gpu.main(["--small", "--models", "tiny-a", "--runs", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    results = json.loads(out.read_text())
    assert results["small"] and results["machine"]["device"] == "cpu" and results["matmul_tflops"] > 0
    assert not results["sets_left_out"] and not results["skipped"]
    model = results["models"]["tiny-a"]
    for name in ("scifi", "clifford"):
        part = model["sets"][name]
        row, methods = part["row"], part["methods"]
        assert row["prompts"] == 8 and row["probe_calls"] == row["cpu_plan_calls"] == 3  # root, scenarios, questions
        assert row["plan"]["rule"] == "cpu" and row["floor_s"] > 0 and row["probe_s"] > 0
        for method in ("probe", "probe, no self-check", "probe, CPU plan", "straightforward"):
            assert methods[method]["best_s"] > 0 and methods[method]["agrees"], method
        assert methods["straightforward"]["forward_calls"] == 1  # 8 prompts in one batch of 16
        lm_eval = methods["lm-eval"]
        assert ("best_s" in lm_eval and lm_eval["agrees"]) or lm_eval["error"]  # installed by the [bench] extra only
        assert f"{name} (8)" in printed
    for plan in ("device plan", "CPU plan"):
        profile = model["profiles"]["clifford"][plan]
        assert profile["forward_calls"] == 3 and profile["kernel_launches"] > 100
        assert profile["time_by_kind_s"]["matrix products"] > 0 and profile["top_operators"]["aten::linear"] > 0
    checks = model["first_checks"]
    assert set(checks) == {"bfloat16", "float16"}
    assert all(c["reference"] == "float32 replay" and not c["false_alarm"] and c["max_diff"] <= c["tolerance"]
               for c in checks.values())
    training = results["training"]
    assert training["probes_at"] == [0, 1, 2] and len(training["probe_s"]) == 3 and len(training["step_s"]) == 2
    assert 0 < training["share_of_training"] < 1
