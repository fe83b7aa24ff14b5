"""A causal LM's loss and every LoRA gradient, end to end (docs/python.md, "End to end").

Three runs of the same model on the same seeded token ids, to the mean next-token loss:
- prod: the model as the user has it (its dtype, device, patches and loss function);
- base: a copy in the model's dtype and on its device in which every GPTQ linear is a plain one
  (the exactly dequantized weight rounded once to the activation dtype, x Wᵀ, and for a LoRA
  linear peft's adapter path in the adapters' dtype) and every instance-level forward override
  (how model patchers install fused kernels) is reset to its class's forward;
- ref: the same plain copy in fp64 on the CPU, adapters and weights converted exactly.
Each LoRA gradient passes when its error's Frobenius norm is at most twice the baseline's, the
per-token losses when their mean error is at most twice the baseline's (as the training kind's
are), and the model's own loss within the same limit plus its mean's rounding: statistics over
many elements, where a maximum without a floor would fail a correct model by chance; the
element-wise rule with its derived floor is the per-module checks' (docs/verification.md,
"End to end"). The reference is the model's own module code in fp64, not gradscope's
independent reference: it localises nothing and proves the parts between the layers
(embedding, final norm, lm_head, the loss) and the wiring; the per-module checks are the
independent ones.
"""
from __future__ import annotations

import copy
import math
from typing import Dict, List, Optional, Sequence, Set, Tuple

import torch
from torch.utils.dlpack import to_dlpack

from .dtypes import ACTIVATION_DTYPES, name_of
from .lora_linear import LoraLinear, is_gptq, zero_format_of
from . import _gradscope
from .results import Case, from_result

# End to end runs at least this many tokens: its statistics are means over them.
MIN_TOKENS = 256


class NotRun(Exception):
    """End to end cannot run on this model; the message says why."""


class _PlainQuantLinear(torch.nn.Module):
    """x @ Wᵀ (+ bias) in x's dtype, Wᵀ [in, out] as GPTQ QuantLinears hold it: a plain
    QuantLinear over the exactly dequantized weight."""

    weight_t: torch.Tensor
    bias: Optional[torch.Tensor]

    def __init__(self, weight_t: torch.Tensor, bias: Optional[torch.Tensor]) -> None:
        super().__init__()
        self.register_buffer("weight_t", weight_t)
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x @ self.weight_t.to(x.dtype)
        return y if self.bias is None else y + self.bias.to(x.dtype)


class _PlainLoraLinear(_PlainQuantLinear):
    """y = (x Wᵀ + b) + B(A(x)) · scaling, summed in the wider dtype and rounded to x's: peft's
    LoRA linear over a plain QuantLinear, without dropout (end to end runs none)."""

    def __init__(self, weight_t: torch.Tensor, bias: Optional[torch.Tensor],
                 lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float) -> None:
        super().__init__(weight_t, bias)
        self.lora_a = torch.nn.Parameter(lora_a)
        self.lora_b = torch.nn.Parameter(lora_b)
        self.scaling = scaling

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        h = torch.nn.functional.linear(x.to(self.lora_a.dtype), self.lora_a)
        h = torch.nn.functional.linear(h, self.lora_b) * self.scaling
        return (y + h).to(x.dtype)


def _dense_weight(path: str, base: torch.nn.Module, zero_format: Optional[str]) -> torch.Tensor:
    """The base's weight, transposed ([in, out]), in fp64 on the CPU, exact: dequantize computes
    scale · (code − zero) in fp32, and an fp16/bf16 scale times an integer of at most 9 bits
    fits fp32's 24-bit significand (docs/gptq-format.md)."""
    fmt = zero_format_of(base) or zero_format
    if fmt is None:
        raise NotRun(f"{path} does not say how its qzeros store zero points: pass "
                     "zero_format='gptq' (v1) or 'gptq_v2'")
    try:
        w = torch.ops.gradscope.dequantize(base.qweight.cpu(), base.qzeros.cpu(),
                                           base.scales.cpu(), base.g_idx.cpu().to(torch.int32),
                                           int(getattr(base, "bits")), fmt, torch.float32)
    except RuntimeError as e:
        raise NotRun(f"{path}: its packed weight cannot be dequantized: {e}") from None
    return w.double()


def _plain_copy(model: torch.nn.Module, loras: List[LoraLinear],
                quantized: Dict[str, torch.nn.Module], adapter: str,
                dense: Dict[str, torch.Tensor], dtype: Optional[torch.dtype]
                ) -> Tuple[torch.nn.Module, Dict[str, _PlainLoraLinear]]:
    """The model with plain GPTQ linears (LoRA or not) and class forwards. dtype None: the
    model's dtypes and device, its floating tensors shared (read, never written) and the rest
    cloned; torch.float64: everything floating in fp64 on the CPU. The model itself is not
    modified."""
    memo: Dict[int, object] = {}
    plain: Dict[str, _PlainLoraLinear] = {}
    inside: Set[int] = set()
    act = getattr(model, "get_input_embeddings")().weight.dtype

    def weight_and_bias(path: str, base: torch.nn.Module, device: torch.device):
        bias = getattr(base, "bias", None)
        if dtype is None:
            return (dense[path].to(device, act),
                    None if bias is None else bias.detach().clone())
        return dense[path], None if bias is None else bias.detach().cpu().to(dtype)

    for lo in loras:
        m = lo.module
        a = getattr(m, "lora_A")[adapter].weight.detach()
        b = getattr(m, "lora_B")[adapter].weight.detach()
        w, bias = weight_and_bias(lo.path, getattr(m, "base_layer"), a.device)
        if dtype is None:
            p = _PlainLoraLinear(w, bias, a.clone(), b.clone(), lo.scaling())
        else:
            p = _PlainLoraLinear(w, bias, a.cpu().to(dtype), b.cpu().to(dtype),
                                 lo.scaling())
        memo[id(m)] = plain[lo.path] = p
        inside.update(id(t) for t in list(m.parameters()) + list(m.buffers()))
    for path, m in quantized.items():
        memo[id(m)] = _PlainQuantLinear(*weight_and_bias(path, m, getattr(m, "qweight").device))
        inside.update(id(t) for t in list(m.parameters()) + list(m.buffers()))
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) in inside or id(t) in memo:
            continue
        if dtype is None:
            # Shared where floating (base reads them); anything else cloned, so that no module's
            # own bookkeeping in the copy writes to the model's tensors.
            memo[id(t)] = t if t.is_floating_point() else t.detach().clone()
        else:
            converted = t.detach().cpu()
            converted = converted.to(dtype) if converted.is_floating_point() else converted.clone()
            memo[id(t)] = (torch.nn.Parameter(converted, requires_grad=False)
                           if isinstance(t, torch.nn.Parameter) else converted)
    try:
        copied = copy.deepcopy(model, memo)
    except Exception as e:  # a module that cannot be copied (a non-leaf tensor attribute, ...)
        raise NotRun(f"the model cannot be copied for the baseline and the reference: "
                     f"{type(e).__name__}: {e}") from None
    for module in copied.modules():
        # A patcher's fused kernel installed as module.forward = ...: the copy runs the class's.
        module.__dict__.pop("forward", None)
    config = getattr(copied, "config", None)
    if config is not None and getattr(config, "_attn_implementation", None) not in ("eager",
                                                                                    "sdpa"):
        config._attn_implementation = "sdpa"  # plain attention, on any device and in fp64
    return copied, plain


def _check_memory(model: torch.nn.Module, dense: Dict[str, torch.Tensor], rows: int,
                  tokens: int, device: torch.device, act: torch.dtype) -> None:
    """Refuses (NotRun) where the copies would need more than half of what is free: on the
    host the fp64 copy (its tensors, the dense weights, and what a forward keeps for the
    backward: about 16 hidden-sized and 4 MLP-sized activations per layer, the attention
    scores, the logits three times), on the model's device base's dense weights and the same
    activations in the model's dtype (on the host too where the model is there)."""
    config = getattr(model, "config")
    shape = [getattr(config, f, None) for f in ("num_hidden_layers", "hidden_size",
                                                "num_attention_heads")]
    if None in shape:
        raise NotRun(f"{type(config).__name__} has no num_hidden_layers, hidden_size or "
                     "num_attention_heads: the copies' memory cannot be estimated")
    layers, hidden, heads = (int(v) for v in shape if v is not None)
    inter = getattr(config, "intermediate_size", None) or 4 * hidden
    weights = sum(w.numel() for w in dense.values())
    others = sum(t.numel() for t in list(model.parameters()) + list(model.buffers())
                 if t.is_floating_point())
    activations = (layers * rows * tokens * (16 * hidden + 4 * inter + 2 * heads * tokens)
                   + 3 * rows * tokens * config.vocab_size)
    host = 8 * (weights + others + activations)
    size = torch.finfo(act).bits // 8
    on_device = size * (weights + activations)
    if device.type == "cpu":
        host += on_device
    free = _available_bytes()
    if free is not None and host > free // 2:
        raise NotRun(f"the fp64 model needs about {host / 2**30:.1f} GiB, and "
                     f"{free / 2**30:.1f} GiB of host memory are available (at most half used)")
    if device.type == "cuda":
        free_device = torch.cuda.mem_get_info(device)[0]
        if on_device > free_device // 2:
            raise NotRun(f"the baseline's dense weights and activations need about "
                         f"{on_device / 2**30:.1f} GiB on {device}, {free_device / 2**30:.1f} GiB "
                         "are free (at most half used)")


def _available_bytes() -> Optional[int]:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _run(model: torch.nn.Module, tokens: torch.Tensor, params: Sequence[torch.Tensor],
         own_loss: bool, seed: int
         ) -> Tuple[torch.Tensor, torch.Tensor, List[Optional[torch.Tensor]], float]:
    """(loss, per-token losses, gradients of params (None where none reaches it), the model's
    own loss). own_loss: the gradients are the model's loss's (labels=), else the mean
    per-token cross-entropy's in the logits' dtype (fp64 for the reference, which
    transformers' loss would round to fp32)."""
    device = tokens.device
    devices = [device] if device.type == "cuda" else []
    was_training = model.training
    model.train()
    try:
        with torch.random.fork_rng(devices=devices), torch.enable_grad():
            torch.manual_seed(seed)
            out = model(input_ids=tokens, labels=tokens)
            if isinstance(out, tuple) or getattr(out, "logits", None) is None:
                raise NotRun(f"{type(model).__name__} returned no logits for input_ids= and "
                             "labels= (end to end compares them)")
            if getattr(out, "loss", None) is None:
                raise NotRun(f"{type(model).__name__} returned no loss for labels=")
            logits = out.logits[:, :-1]
            wide = torch.float64 if logits.dtype == torch.float64 else torch.float32
            per_token = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]).to(wide), tokens[:, 1:].reshape(-1),
                reduction="none")
            loss = out.loss if own_loss else per_token.mean()
            grads = torch.autograd.grad(loss, params, allow_unused=True)
    finally:
        model.train(was_training)
    return (loss.detach(), per_token.detach(),
            [None if g is None else g.detach() for g in grads], float(out.loss.detach()))


def _capsule(t: torch.Tensor) -> object:
    return to_dlpack(t.detach().contiguous())


def _judge_losses(runs: Dict[str, tuple], where: str, step: int = 0,
                  keep: bool = False) -> List[_gradscope.Check]:
    """The model's loss and per-token losses by the end-to-end rule (harness/verdict)."""
    tensors = {f"{r}_{what}": _capsule(runs[r][i].reshape(1) if what == "loss" else runs[r][i])
               for r in ("prod", "base", "ref") for i, what in ((0, "loss"), (1, "tokens"))}
    return _gradscope.judge_losses(where, tensors, f"step{step}." if step else "", step, keep)


def _refusals(model: torch.nn.Module, loras: List[LoraLinear], adapter: str) -> None:
    config = getattr(model, "config", None)
    if config is None or getattr(config, "vocab_size", None) is None:
        raise NotRun(f"{type(model).__name__} is not a causal LM (no config.vocab_size)")
    if not loras:
        raise NotRun("no LoRA linear over a GPTQ base")
    if getattr(model, "is_gradient_checkpointing", False):
        raise NotRun("gradient checkpointing is on")
    drops = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Dropout) and m.p > 0]
    if getattr(config, "attention_dropout", 0.0):
        drops.append(f"attention_dropout {config.attention_dropout}")
    if drops:
        raise NotRun(f"dropout draws its own masks in each run ({', '.join(drops[:3])}"
                     f"{', ...' if len(drops) > 3 else ''}): set it to 0 to compare end to end; "
                     "the per-module checks draw the case's masks")
    zero = [f"{lo.path}.lora_B.{adapter}.weight" for lo in loras
            if not bool((getattr(lo.module, "lora_B")[adapter].weight != 0).any())]
    if zero:
        raise NotRun(f"{zero[0]}{' and others' if len(zero) > 1 else ''} is all zeros (peft's "
                     "initialisation): every lora_A gradient is exactly zero; end to end needs "
                     "trained adapters")
    frozen = [f"{lo.path}.lora_{x}.{adapter}.weight" for lo in loras for x in "AB"
              if not getattr(lo.module, f"lora_{x}")[adapter].weight.requires_grad]
    if frozen:
        raise NotRun(f"{frozen[0]} does not require grad")




def _judge_steps(model: torch.nn.Module, prod_params: List[torch.Tensor], copies: dict,
                 ref_grads: List[Optional[torch.Tensor]], rows: int, seq: int, seed: int,
                 steps: int, lr: float, where: str) -> List[_gradscope.Check]:
    """`steps` AdamW steps of the reference (fp64, from its own gradients), and at each step k
    the losses of prod and base on the reference's adapters of step k (rounded once to theirs),
    on batch k's tokens: the training kind's teacher forcing, so that a difference is that
    step's and not the sum of the ones before, while state a kernel keeps across steps (an
    adapter or weight cached at the first call) shows. The model's adapters are restored
    after, bit for bit."""
    base, base_params = copies["base"]
    ref, ref_params = copies["ref"]
    device = prod_params[0].device
    optimizer = torch.optim.AdamW(ref_params, lr=lr, betas=(0.9, 0.999), eps=1e-8,
                                  weight_decay=0.0)
    saved = [p.detach().clone() for p in prod_params]
    checks: List[_gradscope.Check] = []
    try:
        for k in range(1, steps + 1):
            with torch.no_grad():
                for p, g in zip(ref_params, ref_grads):
                    p.grad = None if g is None else g.clone()
            optimizer.step()
            with torch.no_grad():  # step k's adapters, rounded once into prod's and base's
                for mine, theirs in ((prod_params, ref_params), (base_params, ref_params)):
                    for p, r in zip(mine, theirs):
                        p.copy_(r.detach().to(p.dtype))
            tokens = torch.randint(0, getattr(model, "config").vocab_size, (rows, seq + 1),
                                   generator=torch.Generator().manual_seed(seed + k))
            try:
                runs = {"prod": _run(model, tokens.to(device), prod_params, own_loss=True,
                                     seed=seed + k)}
            except NotRun:
                raise
            except Exception as e:  # the model's own code: a verdict on it
                checks.append(_gradscope.failed_check(
                    f"{where}/step{k}.error",
                    f"prod raised an error at step {k}: {type(e).__name__}: {e}"))
                break
            runs["base"] = _run(base, tokens.to(device), base_params, own_loss=True,
                                seed=seed + k)
            runs["ref"] = _run(ref, tokens, ref_params, own_loss=False, seed=seed + k)
            ref_grads = runs["ref"][2]
            checks += _judge_losses(runs, where, step=k)
    finally:
        with torch.no_grad():
            for p, s in zip(prod_params, saved):
                p.copy_(s)
    return checks


def judge(model: torch.nn.Module, loras: List[LoraLinear], adapter: str, batch: int, seq: int,
          seed: int, zero_format: Optional[str], dump: Optional[str] = None, steps: int = 0,
          lr: float = 1e-3) -> Case:
    """The end-to-end case of the model; raises NotRun when it cannot be judged. At least
    MIN_TOKENS tokens: max(batch, ceil(MIN_TOKENS / seq)) sequences of seq. `dump`: an HDF5 file
    that gets the case's tensors (write_dump). `steps` > 0: also that many optimizer steps,
    each step's losses judged (_judge_steps)."""
    _refusals(model, loras, adapter)
    try:
        embedding = getattr(model, "get_input_embeddings")().weight
    except (AttributeError, NotImplementedError):
        raise NotRun(f"{type(model).__name__} has no input embedding (get_input_embeddings)") \
            from None
    dtype, device = embedding.dtype, embedding.device
    dtype_name = name_of(dtype)
    if dtype_name is None or dtype_name not in ACTIVATION_DTYPES:
        raise NotRun(f"the model's embedding is {dtype}: expected fp32, fp16 or bf16")
    lora_bases = {id(lo.module.base_layer) for lo in loras}
    quantized = {path: m for path, m in model.named_modules()
                 if is_gptq(m) and id(m) not in lora_bases}
    dense = {lo.path: _dense_weight(f"{lo.path}.base_layer", getattr(lo.module, "base_layer"),
                                    zero_format) for lo in loras}
    dense.update({path: _dense_weight(path, m, zero_format) for path, m in quantized.items()})
    rows = max(batch, -(-MIN_TOKENS // seq))
    _check_memory(model, dense, rows, seq + 1, device, dtype)
    tokens = torch.randint(0, getattr(model, "config").vocab_size, (rows, seq + 1),
                           generator=torch.Generator().manual_seed(seed))
    names = [f"{lo.path}.lora_{x}.{adapter}.weight.grad" for lo in loras for x in "AB"]
    prod_params = [getattr(lo.module, f"lora_{x}")[adapter].weight for lo in loras for x in "AB"]
    where = f"end_to_end.{dtype_name}.b{rows}s{seq}seed{seed}"
    replay = (f"gradscope.check_model(<{type(model).__name__}>, end_to_end=True, batch={batch}, "
              f"seq={seq}, seed={seed}" + (f", adapter={adapter!r}" if adapter != "default" else "")
              + (f", zero_format={zero_format!r}" if zero_format else "")
              + (f", steps={steps}, lr={lr!r}" if steps else "") + ")")
    try:
        runs = {"prod": _run(model, tokens.to(device), prod_params, own_loss=True, seed=seed)}
    except NotRun:
        raise
    except torch.cuda.OutOfMemoryError as e:
        raise NotRun(f"out of memory running the model: {e}") from None
    except Exception as e:  # the model's own forward or backward: a verdict on it
        message = f"prod raised an error: {type(e).__name__}: {e}"
        return _case(where, replay, dtype_name, device, seed,
                     [_gradscope.failed_check(f"{where}/error", message)])
    copies = {}  # name: (the plain copy, its adapters in prod's order), kept for the steps
    for name, target in (("base", None), ("ref", torch.float64)):
        copied, plain = _plain_copy(model, loras, quantized, adapter, dense, target)
        params = [t for lo in loras for t in (plain[lo.path].lora_a, plain[lo.path].lora_b)]
        try:
            runs[name] = _run(copied, tokens.to(device) if target is None else tokens, params,
                              own_loss=target is None, seed=seed)
        except NotRun:
            raise
        except Exception as e:  # the model's class code, unpatched, in a plain copy
            raise NotRun(f"the {name} copy (plain GPTQ linears, class forwards) raised "
                         f"{type(e).__name__}: {e}") from None
        copies[name] = (copied, params) if steps else None
        del copied, plain
    ref_loss, ref_tokens, ref_grads, ref_own = runs["ref"]
    # prod and base differentiate the model's own loss, ref the mean token cross-entropy: the
    # two must be one quantity (no label smoothing, auxiliary loss or other reduction).
    if not math.isclose(ref_own, float(ref_loss), rel_tol=1e-5, abs_tol=1e-6):
        raise NotRun(f"the model's loss for labels= is {ref_own:.8g} in fp64, the mean next-token "
                     f"cross-entropy {float(ref_loss):.8g}: end to end needs the model's loss to "
                     "be that mean")
    for name in ("base", "ref"):
        values = [runs[name][0], runs[name][1]] + [g for g in runs[name][2] if g is not None]
        if not all(bool(torch.isfinite(v).all()) for v in values):
            raise NotRun(f"the {name} run is not finite (a value past the range of "
                         f"{dtype_name if name == 'base' else 'fp64'}): no limit can be derived")
    keep = dump is not None
    checks = _judge_losses(runs, where, keep=keep)
    for i, (name, param) in enumerate(zip(names, prod_params)):
        prod_grad, base_grad, ref_grad = runs["prod"][2][i], runs["base"][2][i], ref_grads[i]
        if ref_grad is None or base_grad is None:
            continue  # the adapter is not in the loss's graph, in the plain model either
        try:
            checks.append(_gradscope.judge_gradient(
                where, name, None if prod_grad is None else _capsule(prod_grad),
                _capsule(base_grad), _capsule(ref_grad), name_of(param.dtype) or "",
                keep_tensors=keep))
        except _gradscope.EndToEndNotJudged as e:
            raise NotRun(str(e)) from None
    if steps:
        checks += _judge_steps(model, prod_params, copies, runs["ref"][2], rows, seq, seed,
                               steps, lr, where)
    return _case(where, replay, dtype_name, device, seed, checks, dump)


def _case(where: str, replay: str, dtype_name: str, device: torch.device, seed: int,
          checks: List[_gradscope.Check], dump: Optional[str] = None) -> Case:
    """The model's case from the engine's checks, its dump written by the engine's writer."""
    result = _gradscope.model_case(where, replay, dtype_name, device.type, seed, checks)
    if dump:
        _gradscope.write_dump(dump, result, device.type)
    case = from_result(result)
    for check in case.checks:
        check.name = check.path[len(where) + 1:]
    return case
