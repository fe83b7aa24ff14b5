"""check_module: an nn.Module as the user has it, judged by gradscope's rule (docs/python.md).

The module is read for its configuration (readers.py: shapes, GPTQ bits and groups, LoRA rank,
alpha, rsLoRA, dropout, bias, adapter dtype) by the names peft and GPTQ QuantLinears use;
gradscope builds the case of that configuration from typed values through the binding,
registers the module as the implementation under test of the kind's operator in a namespace of
its own (registration.py), and runs the case in this process: the seeded inputs go into the
module's own parameters and buffers by name, the case's dropout mask replaces the module's
dropout draw, and the module's own forward runs, its own dequantization included. The fp64
reference and the baseline are gradscope's. Checks come back named by the module's own
parameter paths.
"""
from __future__ import annotations

import functools
import itertools
import os
import warnings
from typing import Callable, Dict, List, Optional, Sequence, Union

import torch
from torch.utils.dlpack import to_dlpack

from . import _gradscope, api, readers
from .dtypes import ACTIVATION_DTYPES, torch_dtype
from .errors import GradscopeInputError
from .registration import parameter_name, register
from .results import Case, CheckStatus, Outcome, failure_lines

_namespaces = itertools.count()
# The tensors a case takes for x and the output gradients: the activation dtypes.
FLOATING = tuple(torch_dtype(d) for d in ACTIVATION_DTYPES)


def _require_whole(name: str, value: object) -> None:
    """A whole-number argument as the case's field takes it: an int, not a bool, a float or a
    str (the engine refuses those too; this names the argument before anything reads it)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise GradscopeInputError(f"{name}={value!r}: expected a whole number (an int)")


def _in_training_mode(check: Callable[..., List[Case]]) -> Callable[..., List[Case]]:
    """Runs `check` with the module in training mode, restored after: dropout draws as in
    training, and GPTQModel's QuantLinears switch their zero points to the v2 words their
    training kernel reads before anything of them is read."""

    @functools.wraps(check)
    def in_training(module: torch.nn.Module, **kwargs) -> List[Case]:
        __tracebackhide__ = True
        if not isinstance(module, torch.nn.Module):
            raise GradscopeInputError(f"module: a {type(module).__name__}, expected a "
                                      "torch.nn.Module")
        was_training = module.training
        module.train()
        try:
            return check(module, **kwargs)
        finally:
            module.train(was_training)

    return in_training


@_in_training_mode
def check_module(
    module: torch.nn.Module,
    *,
    kind: Optional[str] = None,
    adapter: str = "default",
    dtypes: Union[str, Sequence[str]] = ("fp32", "fp16", "bf16"),
    batch: int = 2,
    seq: int = 17,
    seed: int = 1,
    zero_format: Optional[str] = None,
    weights: str = "case",
    inputs: Optional[Dict[str, torch.Tensor]] = None,
    dump: Optional[str] = None,
    raise_on_failure: bool = True,
) -> List[Case]:
    """Judges `module` by gradscope's rule on the case of its own configuration, once per dtype.

    `module`: a LoRA linear over a GPTQ QuantLinear (peft's LoraLayer names: base_layer,
    lora_A/lora_B/lora_dropout[adapter], r, lora_alpha, use_rslora; the base's qweight, qzeros,
    scales, g_idx, bits), an MLP whose gate_proj, up_proj and down_proj are such linears and
    whose act_fn is SiLU (kind mlp), or a module with such q_proj, k_proj, v_proj (kind qkv: the
    three projections of one input), or a decoder layer of a declared model family (its
    config.model_type in families/: Llama, Mistral, Granite; docs/model-families.md) with such
    linears on all seven projections (kind layer: the layer called whole, its own RMSNorm,
    rotary embedding, attention and residuals included; checks its output, input gradient and
    every adapter gradient). `zero_format` says how the base's
    qzeros store zero points where the base has no `zero_format` attribute. `weights`: "case"
    draws every weight from the seeded case; "module" runs on the module's own packed bases,
    biases, adapters (and a layer's norms), a lora_B of zeros excepted (redrawn, with a
    warning: it would make every lora_A gradient zero). `inputs`: the activation and output
    gradients to use instead of seeded ones, by the case's names ({"x", "dy"}; "dq", "dk", "dv"
    for kind qkv), e.g. captured from the model (check_model(..., inputs="model")). `dump`: an
    HDF5 file that gets every compared tensor and input of the cases (docs/reports.md). Returns
    gradscope.check's Cases, each check's `name` the module's own path
    (`q_proj.lora_A.default.weight.grad`); raises AssertionError naming each failing tensor by
    that path unless raise_on_failure is False, and ModuleRefused (a GradscopeInputError) for a
    module or feature gradscope does not model. A dtype whose checks ran but could not be judged
    (out of range, or an attention past the floor's model: docs/verification.md) raises
    GradscopeInputError with the reason, or with raise_on_failure False comes back as a Case of
    status "invalid".
    """
    __tracebackhide__ = True
    for name, value in (("batch", batch), ("seq", seq), ("seed", seed)):
        _require_whole(name, value)
    for name, t in (inputs or {}).items():
        if not isinstance(t, torch.Tensor) or t.dtype not in FLOATING:
            raise GradscopeInputError(
                f"inputs[{name!r}]: a {getattr(t, 'dtype', type(t).__name__)}, expected a "
                f"floating tensor ({', '.join(str(d) for d in FLOATING)})")
    x = (inputs or {}).get("x")
    if x is not None and x.dim() == 3:  # the case's tokens are the given activation's
        batch, seq = int(x.shape[0]), int(x.shape[1])
    case = readers.read(module, kind, adapter, seq)
    if weights not in ("case", "module"):
        raise GradscopeInputError(f"weights={weights!r}: expected 'case' or 'module'")
    dtypes = [dtypes] if isinstance(dtypes, str) else list(dtypes)
    origin = f"check_module(<{type(module).__name__}>)"
    built = _gradscope.build_cases(case.kind, case.fields(batch, seq, seed, zero_format),
                                   {"dtype": dtypes}, origin=origin)
    given = _given_tensors(case, module, adapter, weights, inputs, built[0])
    if given:  # each case consumes its own capsules
        source = f"{origin}: " + ("weights='module'" if weights == "module" else "inputs=")
        built = [c.with_tensors({n: to_dlpack(t) for n, t in given.items()}, source)
                 for c in built]
    ns = f"gradscope_module_{os.getpid()}_{next(_namespaces)}"
    library = None
    try:
        library = register(ns, case, module, adapter)
        cases = api.judge(api.run_cases(built, impl=ns, dump=dump), f"module {origin}",
                          raise_on_failure=False, raise_on_invalid=False)
    finally:
        if library is not None:
            library._destroy()
    for result in cases:
        for check in result.checks:
            check.name = parameter_name(check.path, case.kind, adapter)
        # The namespace lives as long as this call: the replay is this call for the case's dtype.
        result.replay = (f"gradscope.check_module(<{type(module).__name__}>, kind={case.kind!r}, "
                         f"dtypes={result.id.split('.')[1]!r}, batch={batch}, seq={seq}, "
                         f"seed={seed}" + (f", zero_format={zero_format!r}" if zero_format else "")
                         + (", weights='module'" if weights == "module" else "")
                         + (f", inputs=<{', '.join(sorted(inputs))}>" if inputs else "") + ")")
    if raise_on_failure:
        _raise_for(cases, f"{type(module).__name__} (kind {case.kind})")
    return cases


def _given_tensors(case: readers.ModuleCase, module: torch.nn.Module, adapter: str,
                   weights: str, inputs: Optional[Dict[str, torch.Tensor]],
                   built: _gradscope.Case) -> Dict[str, torch.Tensor]:
    """The tensors the case takes from the module (weights="module") and from `inputs`, whose
    names are the kind's (the built case's `inputs`, from its declaration)."""
    expected = built.inputs
    given: Dict[str, torch.Tensor] = {}
    if weights == "module":
        given, redrawn = case.module_tensors(module, adapter, built)
        for name in redrawn:
            warnings.warn(f"check_module: {name} is all zeros (peft's initialisation), "
                          "which makes every lora_A gradient zero: drawn from the case "
                          "instead", stacklevel=4)
    for name, t in (inputs or {}).items():
        if name not in expected:
            raise GradscopeInputError(f"inputs: {name!r} is not an input of kind {case.kind} "
                                      f"(expected {', '.join(expected)})")
        given[name] = t.detach().float().cpu().contiguous()
    return given


def _raise_for(cases: List[Case], what: str) -> None:
    """AssertionError naming each failing tensor; else GradscopeInputError where a dtype's
    checks ran and could not be judged (no verdict on this module: an input problem for a
    caller who asked for one; check_model reports it instead)."""
    __tracebackhide__ = True
    failing = [c for c in cases if c.outcome is Outcome.FAIL]
    if failing:
        lines = [f"{len(failing)} of {len(cases)} dtypes failed for {what}"]
        for c in failing:
            lines += failure_lines(c, named=True)
        raise AssertionError("\n".join(lines))
    invalid = [c for c in cases if c.outcome is Outcome.INVALID]
    if invalid:
        lines = [f"{len(invalid)} of {len(cases)} dtypes could not be judged for {what}"]
        for c in invalid:
            lines += [f"  {k.message}" for k in c.checks
                      if k.verdict is CheckStatus.OUT_OF_RANGE][:1]
        raise GradscopeInputError("\n".join(lines))


