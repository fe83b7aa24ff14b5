"""gradscope's pytest plugin (python/gradscope/pytest_plugin.py), run as a user runs it: each
test starts a pytest of its own (pytester) with the plugin and reads what it reports.

Run: python3 -m pytest -p pytester tests/python/test_pytest_plugin.py, with gradscope and
plain_torch_impl (tests/python) on PYTHONPATH.
"""
from __future__ import annotations

import pathlib
import re
import subprocess

import pytest

import gradscope

pytest_plugins = ["pytester"]

CASES = pathlib.Path(__file__).resolve().parents[2] / "cases"
LORA_W = str(CASES / "smoke" / "lora_w.toml")
VARIANTS = str(CASES / "smoke" / "lora_w_variants.toml")
PLAIN = ["--gradscope-impl", "plain_py", "--gradscope-import", "plain_torch_impl"]


@pytest.fixture
def run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    # The plugin by module name: an installed gradscope's entry point would register it again.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")

    def run(*args: str) -> pytest.RunResult:
        return pytester.runpytest_subprocess("-p", "gradscope.pytest_plugin",
                                             "-p", "no:cacheprovider", *args)

    return run


def test_one_item_per_case_named_by_its_id(run) -> None:
    ids = gradscope.list_cases(LORA_W, filter="*fp32*")
    result = run("--gradscope-cases", LORA_W, "--gradscope-filter", "*fp32*", "--collect-only",
                 "-q")
    lines = [line for line in result.outlines if "::" in line]
    assert lines == [f"gradscope[cases]::{i}" for i in ids]
    assert f"{len(ids)} tests collected" in result.stdout.str()


def test_k_selects_a_case_and_it_passes(run) -> None:
    case = gradscope.list_cases(LORA_W, filter="*bf16*r16*")[0]
    result = run("--gradscope-cases", LORA_W, *PLAIN, "-k", case)
    result.assert_outcomes(passed=1, deselected=len(gradscope.list_cases(LORA_W)) - 1)


def test_a_failing_case_shows_gradscopes_message_and_no_frames(run) -> None:
    case = gradscope.list_cases(LORA_W, filter="*fp32*r8*")[0]
    result = run("--gradscope-cases", LORA_W, "--gradscope-impl", "plain_py_unscaled",
                 "--gradscope-import", "plain_torch_impl", "-k", case)
    result.assert_outcomes(failed=1, deselected=len(gradscope.list_cases(LORA_W)) - 1)
    out = result.stdout.str()
    assert f"{case}: fail" in out
    assert "o_proj/lora_B.grad: |prod - ref|" in out
    replay = re.search(r"replay: (python3 -m gradscope run .*)", out)
    assert replay and replay.group(1).endswith("--import 'plain_torch_impl'"), out
    assert "api.py" not in out and "pytest_plugin.py" not in out, out


def test_declined_cases_are_skips_with_the_reason(run) -> None:
    result = run("--gradscope-cases", VARIANTS, "--gradscope-filter", "*.b3g*", *PLAIN,
                 "-rs")
    n = len(gradscope.list_cases(VARIANTS, filter="*.b3g*"))
    assert n > 0
    result.assert_outcomes(skipped=n)
    out = result.stdout.str()
    assert "plain_py declines this case: plain_py::lora_w: NotImplementedError: plain_py: 3-bit " \
        "words are not unpacked here" in out, out
    assert "At:" not in out, out


def test_a_case_that_cannot_be_judged_fails_with_the_reason(run) -> None:
    case = gradscope.list_cases(LORA_W)[0]
    result = run("--gradscope-cases", LORA_W, "--gradscope-impl", "nobody", "-k", case)
    result.assert_outcomes(failed=1, deselected=len(gradscope.list_cases(LORA_W)) - 1)
    out = result.stdout.str()
    assert "not judged (exit 2)" in out and "has no operator nobody::lora_w" in out, out


def test_a_bad_selection_is_a_usage_error(run) -> None:
    result = run("--gradscope-cases", LORA_W, "--gradscope-filter", "no-such-case*")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "no case id matches --filter 'no-such-case*'" in result.stderr.str()


def test_without_options_the_plugin_collects_nothing_and_offers_the_fixture(
        run, pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_mine=f"""
        def test_my_kernels(gradscope_check):
            cases = gradscope_check({LORA_W!r}, filter="*bf16*r16*")
            assert len(cases) == 4 and all(c.passed for c in cases)
    """)
    result = run(*PLAIN)
    result.assert_outcomes(passed=1)


def test_the_fixtures_replay_line_runs_as_printed(run, pytester: pytest.Pytester) -> None:
    """A failure through the gradscope_check fixture names the modules --gradscope-import
    imported, so its replay line reruns the case with the same implementation (exit 1)."""
    pytester.makepyfile(test_mine=f"""
        def test_my_kernels(gradscope_check):
            gradscope_check({LORA_W!r}, filter="*fp32*r8*p0.1.bias*")
    """)
    result = run("--gradscope-impl", "plain_py_unscaled", "--gradscope-import", "plain_torch_impl")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    replay = re.search(r"replay: (python3 -m gradscope run .*)", out)
    assert replay and replay.group(1).endswith("--import 'plain_torch_impl'"), out
    again = subprocess.run(replay.group(1), shell=True, capture_output=True, text=True)
    assert again.returncode == 1 and "1 failed" in again.stdout, (replay.group(1), again)


def test_the_check_module_fixture_takes_the_seed(run, pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_layer="""
        import gradscope
        from peft.tuners.lora import LoraConfig
        from peft.tuners.lora.gptq import GPTQLoraLinear

        def test_my_layer(gradscope_check_module):
            base = gradscope.QuantLinear(4, 32, 64, 32)
            layer = GPTQLoraLinear(base, "default", config=LoraConfig(r=4, lora_alpha=8), r=4,
                                   lora_alpha=8)
            [case] = gradscope_check_module(layer, dtypes="fp32")
            assert case.passed and case.id.endswith(".s7"), case.id
    """)
    run("--gradscope-seed", "7").assert_outcomes(passed=1)


def test_the_check_model_fixture_takes_the_seed_and_fails_without_frames(
        run, pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_model="""
        from lora_models import tiny_llama_down_proj_bug, tiny_llama_trained

        def test_my_model(gradscope_check_model):
            report = gradscope_check_model(tiny_llama_trained(), dtypes="fp32")
            [case] = report.modules[-1].cases
            assert report.passed and case.id.endswith("seed7"), case.id

        def test_my_buggy_model(gradscope_check_model):
            gradscope_check_model(tiny_llama_down_proj_bug(), dtypes="fp32")
    """)
    result = run("--gradscope-seed", "7")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "first divergence: model.layers.1.mlp (mlp); 1 of 6 modules failed" in out, out
    assert "check_module.py:" not in out, out


def test_the_package_declares_the_entry_point() -> None:
    pyproject = (CASES.parent / "pyproject.toml").read_text()
    entry = r'\[project\.entry-points\.pytest11\]\s*\ngradscope = "gradscope\.pytest_plugin"'
    assert re.search(entry, pyproject), pyproject
