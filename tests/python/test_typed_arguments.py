"""Arguments reach the engine as typed values: a value of the wrong type is refused naming the
argument, never converted, and no text can add a key to a case (issue class "arguments pasted
into a case")."""
from __future__ import annotations

import pytest
import torch

import gradscope
import lora_models as lm


@pytest.fixture(scope="module")
def o_proj() -> torch.nn.Module:
    return lm.lora(lm.quant(64, 32, group=32), r=4, alpha=8.0)


@pytest.mark.parametrize("argument, value", [
    ("seq", "17\nx_scale = 1000"), ("seq", "17"), ("seq", 4.7), ("batch", 3.5),
    ("batch", True), ("seed", "1")])
def test_check_module_refuses_a_value_of_another_type(o_proj, argument, value):
    with pytest.raises(gradscope.GradscopeInputError, match=f"^{argument}="):
        gradscope.check_module(o_proj, dtypes="fp32", **{argument: value})


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.complex64, torch.float64])
def test_check_module_refuses_inputs_that_are_not_an_activation_dtype(o_proj, dtype):
    x = torch.ones(1, 5, 64).to(dtype)
    with pytest.raises(gradscope.GradscopeInputError, match=r"inputs\['x'\]"):
        gradscope.check_module(o_proj, dtypes="fp32", inputs={"x": x})


def test_the_engine_refuses_a_field_of_another_type():
    """Below check_module, the engine's own check: the field named, nothing converted."""
    from gradscope import _gradscope

    with pytest.raises(gradscope.GradscopeInputError,
                       match="here: key 'seq' must be an integer, got a string"):
        _gradscope.build_cases("lora_w", {"seq": "17"}, origin="here")
    with pytest.raises(gradscope.GradscopeInputError, match="key 'dropout' must be a number, got "
                                                            "a boolean"):
        _gradscope.build_cases("lora_w", {"dropout": True}, origin="here")
    with pytest.raises(gradscope.GradscopeInputError, match="unknown key 'x_scale\n' for kind"):
        _gradscope.build_cases("lora_w", {"x_scale\n": 1.0}, origin="here")
    with pytest.raises(gradscope.GradscopeInputError, match="holds a NUL character"):
        _gradscope.build_cases("lora_w", {"adapter_dtype": "fp32\x00"}, origin="here")
    [case] = _gradscope.build_cases("lora_w", {"seq": 5, "alpha": 8}, origin="here")
    assert case.fields["alpha"] == 8.0 and isinstance(case.fields["alpha"], float)


@pytest.mark.parametrize("kwargs, words", [
    ({"seed": "3"}, "seed='3'"), ({"filter": 3}, "filter"), ({"dtype": 16}, "dtype=16")])
def test_check_refuses_a_selection_of_another_type(kwargs, words):
    with pytest.raises(gradscope.GradscopeInputError, match=words):
        gradscope.check("cases/smoke/lora_w.toml", **kwargs)


def test_a_module_that_is_not_one():
    with pytest.raises(gradscope.GradscopeInputError, match="module: a NoneType"):
        gradscope.check_module(None)  # type: ignore[arg-type]
