"""check_model: every LoRA module of a model judged by check_module, in the model's order, then
the model end to end (docs/python.md, "A model, module by module")."""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch

from . import end_to_end as e2e
from . import lora_linear, readers
from .check_module import check_module
from .errors import GradscopeInputError, ModuleRefused
from .readers import (_ATTENTION, _MLP, _is_decoder_layer, _lora_linear, gradients_of,
                      input_names)
from .results import Case


@dataclasses.dataclass
class ModuleResult:
    """One module of a model, judged by check_module."""

    path: str  # the module's path in the model, e.g. model.layers.3.mlp
    kind: str  # lora_w, qkv, mlp or layer
    cases: List[Case]  # one per dtype

    @property
    def passed(self) -> bool:
        """No case failed; a dtype the module declined (unsupported) or one that could not be
        judged (invalid, e.g. an attention past the floor's model) is not a failure."""
        return all(c.passed or c.status in ("unsupported", "invalid") for c in self.cases)

    @property
    def unsupported(self) -> List[str]:
        """The dtypes the module declined."""
        return [c.id.split(".")[1] for c in self.cases if c.status == "unsupported"]

    @property
    def not_judged(self) -> List[str]:
        """The dtypes whose checks ran but could not be judged (their messages say why)."""
        return [c.id.split(".")[1] for c in self.cases if c.status == "invalid"]

    def worst(self) -> Tuple[float, str]:
        """The largest err/limit over the module's checks, and the tensor it is on."""
        ratios = [(k.max_abs / k.limit, f"{self.path}.{k.name}") for c in self.cases
                  for k in c.checks
                  if k.max_abs is not None and k.limit and k.status != "out_of_range"]
        return max(ratios, default=(0.0, self.path))


@dataclasses.dataclass
class Refusal:
    """A module check_model could not judge as its kind, and the parts it judged instead."""

    path: str
    kind: str
    reason: str  # the ModuleRefused message
    judged_by: List[str]  # the paths of its parts judged in its place; empty: none


@dataclasses.dataclass
class ModelReport:
    """check_model's result: every module it found, in the model's order, then the model end
    to end (path "end_to_end", kind "model") where it ran, or a note saying why it did not."""

    modules: List[ModuleResult]
    note: str = ""
    refused: List[Refusal] = dataclasses.field(default_factory=list)

    @property
    def unjudged(self) -> List[Refusal]:
        """The modules neither judged as their kind nor by parts of theirs."""
        return [r for r in self.refused if not r.judged_by]

    @property
    def passed(self) -> bool:
        return all(m.passed for m in self.modules)

    @property
    def first_failure(self) -> Optional[ModuleResult]:
        return next((m for m in self.modules if not m.passed), None)

    @property
    def not_judged(self) -> List[ModuleResult]:
        """The modules with a dtype whose checks could not be judged (no verdict there)."""
        return [m for m in self.modules if m.not_judged]

    def divergence_lines(self) -> List[str]:
        """The first failing module and each of its failing tensors, by path; empty if none."""
        first = self.first_failure
        if first is None:
            return []
        lines = [f"first divergence: {first.path} ({first.kind}); "
                 f"{sum(not m.passed for m in self.modules)} of {len(self.modules)} modules "
                 "failed"]
        for c in first.cases:
            lines += [f"  {first.path}.{k.name}: {k.message}" for k in c.checks
                      if k.status == "fail"]
        return lines

    def table(self) -> str:
        """One line per module: verdict, the worst err/limit and where."""
        width = max((len(m.path) for m in self.modules), default=4)
        lines = [f"{'module':<{width}}  kind    verdict  worst err/limit"]
        for m in self.modules:
            ratio, where = m.worst()
            declined = f"  ({', '.join(m.unsupported)} unsupported)" if m.unsupported else ""
            if m.not_judged:
                declined += f"  ({', '.join(m.not_judged)} not judged)"
            verdict = "FAIL" if not m.passed else "invalid" if m.not_judged else "pass"
            lines.append(f"{m.path:<{width}}  {m.kind:<6}  {verdict:<7}  "
                         f"{ratio:.3g}  {where[len(m.path) + 1:]}{declined}")
        for r in self.refused:
            instead = (f"judged by {', '.join(r.judged_by)}" if r.judged_by
                       else "NOT JUDGED")
            lines.append(f"{r.path:<{width}}  {r.kind:<6}  refused  {instead}: {r.reason}")
        return "\n".join(lines + ([self.note] if self.note else []))


def _model_modules(model: torch.nn.Module, by: str) -> Iterator[Tuple[str, str]]:
    """(path, kind) of every module check_module reads, in the model's order: with by="layer"
    each decoder layer whole (layer); otherwise, and for what is outside the layers, an
    attention's q/k/v together (qkv) and its o_proj (lora_w), an MLP (mlp), any other LoRA
    linear (lora_w)."""
    covered: set = set()
    for path, module in model.named_modules():
        if any(path.startswith(c + ".") for c in covered):
            continue
        if by == "layer" and _is_decoder_layer(module) and all(
                lora_linear.is_lora(getattr(getattr(module, parent), name, None))
                for parent, names in (("self_attn", _ATTENTION), ("mlp", _MLP))
                for name in names):
            covered.add(path)
            yield path, "layer"
        elif all(lora_linear.is_lora(getattr(module, m, None)) for m in ("gate_proj", "up_proj", "down_proj")):
            covered.add(path)
            yield path, "mlp"
        elif all(lora_linear.is_lora(getattr(module, m, None)) for m in ("q_proj", "k_proj", "v_proj")):
            yield path, "qkv"
            covered.update(f"{path}.{m}" for m in ("q_proj", "k_proj", "v_proj"))
        elif lora_linear.is_lora(module) and path not in covered:
            covered.add(path)
            yield path, "lora_w"


def _parts(module: torch.nn.Module, path: str, kind: str) -> List[Tuple[str, str]]:
    """What judges a refused module in its place: a decoder layer's attention and MLP by module,
    an attention's or MLP's projections one by one; nothing for one LoRA linear."""
    if kind == "layer":
        return [(f"{path}.{sub}", k) for sub, k in _model_modules(module, "module")]
    names = {"qkv": _ATTENTION[:3], "mlp": _MLP}.get(kind, ())
    return [(f"{path}.{n}", "lora_w") for n in names
            if lora_linear.is_lora(getattr(module, n, None))]


def _readable(modules: Dict[str, torch.nn.Module], found: List[Tuple[str, str]], adapter: str,
              batch: int, seq: int, seed: int, zero_format: Optional[str]
              ) -> Tuple[List[Tuple[str, str]], List[Refusal]]:
    """The modules check_module reads as their kind, each refused one replaced by its parts
    (and theirs, down to single LoRA linears), with the refusals: one module the reference
    does not model leaves the rest of the model judged."""
    readable: List[Tuple[str, str]] = []
    refused: List[Refusal] = []

    def visit(path: str, kind: str) -> None:
        try:
            readers.read(modules[path], kind, adapter, seq).fields(batch, seq, seed, zero_format)
            readable.append((path, kind))
        except ModuleRefused as e:
            parts = _parts(modules[path], path, kind)
            refused.append(Refusal(path, kind, str(e), [p for p, _ in parts]))
            for part in parts:
                visit(*part)

    for path, kind in found:
        visit(path, kind)
    return readable, refused


def _captured_inputs(model: torch.nn.Module, modules: Dict[str, torch.nn.Module],
                     found: List[Tuple[str, str]], batch: int, seq: int, seed: int
                     ) -> Dict[str, Dict[str, torch.Tensor]]:
    """Each module's input and output gradients in one forward and backward of the model on
    seeded token ids, to the mean next-token cross-entropy."""
    config = getattr(model, "config", None)
    vocab = getattr(config, "vocab_size", None)
    if vocab is None:
        raise ModuleRefused(f"{type(model).__name__}: no config.vocab_size; inputs='model' runs "
                            "a causal LM on token ids")
    if getattr(model, "is_gradient_checkpointing", False):
        raise ModuleRefused(f"{type(model).__name__}: gradient checkpointing is on; turn it off "
                            "for the check (model.gradient_checkpointing_disable())")
    captured: Dict[str, Dict[str, torch.Tensor]] = {path: {} for path, _ in found}
    outputs: List[Tuple[str, str, torch.Tensor]] = []  # (path, name, the module's output)
    handles = []

    def keep_input(path: str):
        def hook(module, args, kwargs):
            x = args[0] if args else kwargs.get("hidden_states", kwargs.get("x"))
            captured[path]["x"] = x.detach().clone()
        return hook

    def keep_output(path: str, name: str):
        def hook(module, args, output):
            outputs.append((path, name, output[0] if isinstance(output, tuple) else output))
        return hook

    for path, kind in found:
        module = modules[path]
        first = getattr(module, "q_proj") if kind == "qkv" else module
        handles.append(first.register_forward_pre_hook(keep_input(path), with_kwargs=True))
        # Each gradient the kind takes, hooked on the output it is of: a child of that name
        # (q_proj of an attention, down_proj of an MLP), else the module's own output.
        for name, output in gradients_of(kind):
            child = getattr(module, output, None)
            target = child if isinstance(child, torch.nn.Module) else module
            handles.append(target.register_forward_hook(keep_output(path, name)))
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=g)
    device = next(model.parameters()).device
    tokens = tokens.to(device)
    was_training = model.training
    model.train()
    # The model's own random draws (dropout) from the seed, and its parameters' .grad untouched:
    # the output gradients come from torch.autograd.grad, not backward().
    devices = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices), torch.enable_grad():
            torch.manual_seed(seed)
            logits = model(input_ids=tokens[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(
                logits.float().reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
            frozen = [f"{p}" for p, _, y in outputs if not y.requires_grad]
            if frozen:
                raise ModuleRefused(f"inputs='model': no gradient reaches {', '.join(frozen)} "
                                    "(no parameter upstream of it requires grad)")
            grads = torch.autograd.grad(loss, [y for _, _, y in outputs], allow_unused=True)
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    for (path, name, _), grad in zip(outputs, grads):
        if grad is not None:
            captured[path][name] = grad.detach().clone()
    missing = [f"{p}: {sorted(set(input_names(k)) - set(captured[p]))}" for p, k in found
               if set(input_names(k)) - set(captured[p])]
    if missing:
        raise ModuleRefused("inputs='model': the model's forward and backward did not reach "
                            + "; ".join(missing))
    return captured


def check_model(
    model: torch.nn.Module,
    *,
    adapter: str = "default",
    dtypes: Union[str, Sequence[str]] = ("bf16",),
    batch: int = 1,
    seq: int = 17,
    seed: int = 1,
    zero_format: Optional[str] = None,
    by: str = "module",
    inputs: str = "case",
    dump_dir: Optional[str] = None,
    end_to_end: Union[str, bool] = "auto",
    steps: int = 0,
    lr: float = 1e-3,
    raise_on_failure: bool = True,
) -> ModelReport:
    """Judges every LoRA module of `model` by check_module, one module at a time, in the
    model's order: each decoder layer's q/k/v (kind qkv) and o_proj (lora_w) and its MLP
    (mlp), and any other LoRA linear over a GPTQ base. Each module gets the seeded case of its
    own configuration (module i: seed + i), so a bug shows in the module that has it and not in
    every layer after. by="layer" judges each decoder layer whole instead (kind layer: the
    layer's own norms, rotary embedding, attention and residuals under test too). A module
    check_module cannot read as its kind is judged by its parts instead (a decoder layer by its
    attention and MLP, an attention or MLP by its projections one by one), each such refusal
    in the report (`refused`, the table, the note); a LoRA linear judged by nothing at all
    raises GradscopeInputError naming it unless raise_on_failure is False (`unjudged`).
    inputs="model" judges each module on what the model itself gives it: the model runs seeded
    token ids (batch x seq, its own vocabulary) to the mean next-token loss and back, hooks keep
    each module's input and output gradients, and each module is then checked on those and on
    its own weights (weights="module"), so a module is judged where the model puts it without a
    bug upstream reaching it. `dump_dir`: an existing folder that gets one HDF5 dump per module,
    <module path>.h5, and end_to_end.h5.
    `end_to_end`: also judge the model as it is (its own dtype and device) end to end, its
    loss and every LoRA gradient against the same model in fp64 on the CPU, with a plain
    baseline (gradscope/end_to_end.py; seeded token ids, at least 256): "auto" where the model
    allows it (a causal LM, no dropout, trained lora_B, copies within half the free memory, ...)
    and a note why not otherwise, True to require it (ModuleRefused if it cannot), False to
    skip it. `steps` > 0 (end to end only): that many AdamW steps (`lr`) of the reference, each
    step's losses of the model and the baseline judged on the reference's adapters of that step,
    so that state a kernel keeps across steps shows; the model's adapters are restored after.
    Returns a ModelReport (`table()`, `first_failure`); raises AssertionError naming the first
    failing module and its failing tensors unless raise_on_failure is False.
    """
    __tracebackhide__ = True
    if by not in ("module", "layer"):
        raise GradscopeInputError(f"by={by!r}: expected 'module' or 'layer'")
    found = list(_model_modules(model, by))
    if not found:
        raise ModuleRefused(f"{type(model).__name__}: no LoRA module over a GPTQ base found "
                            "(peft's base_layer/lora_A/lora_B names)")
    if inputs not in ("case", "model"):
        raise GradscopeInputError(f"inputs={inputs!r}: expected 'case' or 'model'")
    if dump_dir is not None and not os.path.isdir(dump_dir):
        raise GradscopeInputError(f"dump_dir {dump_dir}: not a folder")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise GradscopeInputError(f"steps={steps!r}: expected a whole number >= 0")
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise GradscopeInputError(f"lr={lr!r}: expected a finite number > 0")
    if steps and end_to_end is False:
        raise GradscopeInputError("steps: the optimizer steps are judged end to end; "
                                      "end_to_end=False leaves none")
    if not (isinstance(end_to_end, bool) or end_to_end == "auto"):
        raise GradscopeInputError(f"end_to_end={end_to_end!r}: expected 'auto', True or "
                                      "False")
    modules = {path: module for path, module in model.named_modules()}
    found, refused = _readable(modules, found, adapter, batch, seq, seed, zero_format)
    captured = (_captured_inputs(model, modules, found, batch, seq, seed) if inputs == "model"
                else {})
    own = "module" if inputs == "model" else "case"
    # Module i draws from seed + i: layers of one shape still see different values.
    report = ModelReport([
        ModuleResult(path, kind, check_module(modules[path], kind=kind, adapter=adapter,
                                              dtypes=dtypes, batch=batch, seq=seq, seed=seed + i,
                                              zero_format=zero_format, weights=own,
                                              inputs=captured.get(path),
                                              dump=os.path.join(dump_dir, f"{path}.h5")
                                              if dump_dir else None,
                                              raise_on_failure=False))
        for i, (path, kind) in enumerate(found)
    ], refused=refused)
    if refused:
        report.note = (f"{len(refused)} modules refused as their kind "
                       f"({', '.join(r.path for r in refused)}): "
                       + ("each judged by its parts" if not report.unjudged else
                          f"{len(report.unjudged)} judged by nothing")
                       + " (see the table)")
    if end_to_end is not False:
        loras = [p for path, m in model.named_modules() if lora_linear.is_lora(m)
                 for p in [_lora_linear(m, path, adapter)] if p is not None]
        try:
            case = e2e.judge(model, loras, adapter, batch, seq, seed, zero_format,
                             os.path.join(dump_dir, "end_to_end.h5") if dump_dir else None,
                             steps=steps, lr=lr)
            report.modules.append(ModuleResult("end_to_end", "model", [case]))
        except e2e.NotRun as e:
            if end_to_end is True:
                raise ModuleRefused(f"end_to_end=True: {e}") from None
            report.note = "; ".join(n for n in (report.note, f"end to end: not run: {e}") if n)
    if report.first_failure is not None and raise_on_failure:
        raise AssertionError("\n".join(report.divergence_lines() + ["", report.table()]))
    if report.unjudged and raise_on_failure:  # no verdict there: not a pass either
        raise GradscopeInputError("\n".join(
            [f"{len(report.unjudged)} LoRA modules could not be judged at all:"]
            + [f"  {r.path}: {r.reason}" for r in report.unjudged] + ["", report.table()]))
    if report.not_judged and raise_on_failure:  # no verdict there: not a pass either
        raise GradscopeInputError("\n".join(
            [f"{len(report.not_judged)} of {len(report.modules)} modules could not be judged "
             "in some dtype (their checks say why):"]
            + [f"  {m.path}: {k.message}" for m in report.not_judged for c in m.cases
               if c.status == "invalid"
               for k in [k for k in c.checks if k.status == "out_of_range"][:1]]
            + ["", report.table()]))
    return report
