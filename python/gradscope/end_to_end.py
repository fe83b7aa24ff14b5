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
from typing import Dict, List, Optional, Tuple

import torch

from .dtypes import ACTIVATION_DTYPES, assert_close_tolerances, name_of
from .errors import GradscopeInputError
from .lora_linear import LoraLinear, is_gptq, zero_format_of
from .results import Case, Check

# End to end runs at least this many tokens: its statistics are means over them.
MIN_TOKENS = 256


class NotRun(Exception):
    """End to end cannot run on this model; the message says why."""


class _PlainQuantLinear(torch.nn.Module):
    """x @ Wᵀ (+ bias) in x's dtype, Wᵀ [in, out] as GPTQ QuantLinears hold it: a plain
    QuantLinear over the exactly dequantized weight."""

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
                                           int(base.bits), fmt, torch.float32)
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
    inside = set()
    act = model.get_input_embeddings().weight.dtype

    def weight_and_bias(path: str, base: torch.nn.Module, device: torch.device):
        bias = getattr(base, "bias", None)
        if dtype is None:
            return (dense[path].to(device, act),
                    None if bias is None else bias.detach().clone())
        return dense[path], None if bias is None else bias.detach().cpu().to(dtype)

    for lo in loras:
        m = lo.module
        a, b = m.lora_A[adapter].weight.detach(), m.lora_B[adapter].weight.detach()
        w, bias = weight_and_bias(lo.path, m.base_layer, a.device)
        if dtype is None:
            p = _PlainLoraLinear(w, bias, a.clone(), b.clone(), lo.scaling())
        else:
            p = _PlainLoraLinear(w, bias, a.cpu().to(dtype), b.cpu().to(dtype),
                                 lo.scaling())
        memo[id(m)] = plain[lo.path] = p
        inside.update(id(t) for t in list(m.parameters()) + list(m.buffers()))
    for path, m in quantized.items():
        memo[id(m)] = _PlainQuantLinear(*weight_and_bias(path, m, m.qweight.device))
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
    config = model.config
    shape = [getattr(config, f, None) for f in ("num_hidden_layers", "hidden_size",
                                                "num_attention_heads")]
    if None in shape:
        raise NotRun(f"{type(config).__name__} has no num_hidden_layers, hidden_size or "
                     "num_attention_heads: the copies' memory cannot be estimated")
    layers, hidden, heads = shape
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


def _run(model: torch.nn.Module, tokens: torch.Tensor, params: List[torch.Tensor],
         own_loss: bool, seed: int
         ) -> Tuple[torch.Tensor, torch.Tensor, List[Optional[torch.Tensor]], Optional[float]]:
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


def _index(flat: int, shape: torch.Size) -> Tuple[int, ...]:
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return tuple(reversed(index))


def _judge_tensor(name: str, prod: torch.Tensor, base: torch.Tensor, ref: torch.Tensor,
                  dtype: torch.dtype, where: str) -> Check:
    """‖prod − ref‖ <= 2 · ‖base − ref‖ (Frobenius norms, docs/verification.md, "End to end")."""
    path = f"{where}/{name}"
    if prod is None:
        return Check(path, "fail", f"{name}: no gradient reaches it in prod; the exact "
                         f"gradient is not zero (max |ref| {float(ref.abs().max()):.4g})", None,
                         None, name, "frobenius")
    if prod.dtype != dtype or prod.shape != ref.shape:
        return Check(path, "fail", f"{name}: prod is {prod.dtype} {tuple(prod.shape)}, "
                         f"expected {dtype} {tuple(ref.shape)}", None, None, name, "frobenius")
    p, b = prod.detach().cpu().double(), base.detach().cpu().double()
    if not bool((ref != 0).any()):
        raise NotRun(f"{name}: the exact gradient is all zero; no verdict is possible")
    limit = 2 * float((b - ref).norm())
    if not bool(torch.isfinite(p).all()):
        bad = int((~torch.isfinite(p)).sum())
        return Check(path, "fail", f"{name}: {bad} of {p.numel()} elements are not finite",
                         math.inf, limit, name, "frobenius")
    if not bool((p != 0).any()):
        return Check(path, "fail", f"{name}: prod is all zero; the exact gradient is not "
                         f"(max |ref| {float(ref.abs().max()):.4g})", float(ref.norm()),
                         limit, name, "frobenius")
    err = (p - ref).abs()
    norm = float(err.norm())
    if norm <= limit:
        return Check(path, "pass", "", norm, limit, name, "frobenius")
    at = _index(int(err.argmax()), ref.shape)
    base_at = float((b - ref).abs().max())
    cosine = float(torch.nn.functional.cosine_similarity(p.reshape(1, -1), ref.reshape(1, -1)))
    message = (f"{name}: ||prod - ref|| {norm:.4g} > limit {limit:.4g} = 2 x ||base - ref|| "
               f"(Frobenius norms over {p.numel()} elements; end to end, {dtype})\n"
               f"    relative error prod {norm / float(ref.norm()):.3g}, base "
               f"{limit / 2 / float(ref.norm()):.3g}; cosine {cosine:.6f}\n"
               f"    largest |prod - ref| {float(err[at]):.4g} at {at} (base's largest "
               f"{base_at:.4g}): prod {float(p[at]):.6g}, base {float(b[at]):.6g}, ref "
               f"{float(ref[at]):.6g}")
    return Check(path, "fail", message, norm, limit, name, "frobenius")


def _judge_losses(runs: Dict[str, tuple], where: str) -> List[Check]:
    """The per-token losses on their mean, as the training kind's are. The model's loss is
    their mean, and |mean e| <= mean |e|: it gets the same base term, plus the floor of its own
    reduction, which the per-token losses do not see: the mean of n losses summed in the loss's
    dtype (fp32 in transformers) rounds each partial sum S_k = k · loss once, an error of
    standard deviation u · |S_k| / sqrt(3) (u the unit roundoff); divided by n that is
    σ = u · |loss| · sqrt(Σ k²/3) / n, and the floor is 6σ (docs/verification.md)."""
    ref_loss, ref_tokens = runs["ref"][0], runs["ref"][1]
    base_tokens = runs["base"][1].cpu().double()
    prod_loss, prod_tokens = runs["prod"][0], runs["prod"][1].cpu().double()
    base_term = 2 * float((base_tokens - ref_tokens).abs().mean())
    n = ref_tokens.numel()
    unit = torch.finfo(prod_loss.dtype).eps / 2
    sigma = unit * abs(float(ref_loss)) * math.sqrt(n * (n + 1) * (2 * n + 1) / 18) / n
    checks = []
    for name, value, floor, what in (
            ("per_token_loss", float((prod_tokens - ref_tokens).abs().mean()), 0.0,
             "mean |prod - ref| over the tokens"),
            ("loss", abs(float(prod_loss) - float(ref_loss)), 6 * sigma,
             "|prod - ref| of the model's loss")):
        limit = base_term + floor
        ok = math.isfinite(value) and value <= limit
        message = "" if ok else (
            f"{name}: {what} {value:.4g} > limit {limit:.4g} = 2 x mean |base - ref| over the "
            f"tokens {base_term:.4g}" + (f" + floor {floor:.4g} (its mean's rounding)"
                                         if floor else "")
            + f" (end to end); loss prod {float(prod_loss):.6g}, base "
            f"{float(runs['base'][0]):.6g}, ref {float(ref_loss):.6g}")
        checks.append(Check(f"{where}/{name}", "pass" if ok else "fail", message, value,
                                limit, name, "mean_abs" if name == "per_token_loss" else "abs"))
    return checks


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
            if not bool((lo.module.lora_B[adapter].weight != 0).any())]
    if zero:
        raise NotRun(f"{zero[0]}{' and others' if len(zero) > 1 else ''} is all zeros (peft's "
                     "initialisation): every lora_A gradient is exactly zero; end to end needs "
                     "trained adapters")
    frozen = [f"{lo.path}.lora_{x}.{adapter}.weight" for lo in loras for x in "AB"
              if not getattr(lo.module, f"lora_{x}")[adapter].weight.requires_grad]
    if frozen:
        raise NotRun(f"{frozen[0]} does not require grad")




def write_dump(path: str, case: Case, tensors: Dict[str, Tuple[torch.Tensor, ...]],
               dtype_name: str, device: str) -> None:
    """The end-to-end case as an HDF5 dump in gradscope's layout (docs/reports.md): a case group
    and one group per check with prod, base and ref; written whole or not at all."""
    try:
        import h5py
    except ImportError as e:
        raise GradscopeInputError("dump_dir: the end-to-end dump is written with h5py: pip "
                                      "install h5py") from e
    import importlib.metadata
    import os
    import tempfile
    try:
        version = importlib.metadata.version("gradscope")
    except importlib.metadata.PackageNotFoundError:
        version = ""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".gradscope-", suffix=".h5", dir=folder)
    os.close(fd)
    try:
        # Superblock 2 or later (the reader refuses older), and no object format newer than
        # HDF5 1.10 reads: the libhdf5 gradscope links may be 1.10.
        with h5py.File(tmp, "w", libver=("v108", "v110")) as f:
            for key, value in (("format", "gradscope-dump"), ("gradscope_version", version),
                               ("commit", ""), ("device", device), ("gpu", ""),
                               ("torch", torch.__version__), ("cuda", torch.version.cuda or ""),
                               ("compiler", "")):
                f.attrs[key] = str(value)  # variable-length strings (TorchVersion is a subclass)
            f.attrs["schema_version"] = 1
            group = f.create_group(case.id)
            for key, value in (("kind", "model"), ("status", case.status), ("case_toml", ""),
                               ("dtype", dtype_name), ("device", device),
                               ("replay", case.replay)):
                group.attrs[key] = value
            group.attrs["seed"] = int(case.id.rsplit("seed", 1)[1])
            for check in case.checks:
                if check.name not in tensors:
                    continue
                g = f.create_group(f"{case.id}/{check.name}")
                prod, base, ref = tensors[check.name]
                for name, t in (("prod", prod), ("base", base), ("ref", ref)):
                    t = t.detach().cpu()
                    data = (t.double() if t.dtype == torch.float64 else t.float()).numpy()
                    big = data.size >= 4096
                    d = g.create_dataset(name, data=data, chunks=True if big else None,
                                         shuffle=big, compression="gzip" if big else None,
                                         compression_opts=4 if big else None)
                    d.attrs["dtype"] = name_of(t.dtype)
                p, r = prod.detach().cpu().double(), ref.detach().cpu().double()
                rtol, atol = assert_close_tolerances(prod.dtype)
                g.attrs["status"] = check.status
                g.attrs["exact"] = 0
                g.attrs["max_abs"] = float((p - r).abs().max())
                g.attrs["mean_abs"] = float((p - r).abs().mean())
                g.attrs["limit"] = math.nan if check.limit is None else float(check.limit)
                g.attrs["mismatches"] = int(((p - r).abs() > atol + rtol * r.abs()).sum())
                g.attrs["statistic"] = check.statistic
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _judge_steps(model: torch.nn.Module, prod_params: List[torch.Tensor], copies: dict,
                 ref_grads: List[Optional[torch.Tensor]], rows: int, seq: int, seed: int,
                 steps: int, lr: float, where: str) -> List[Check]:
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
    checks: List[Check] = []
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
            tokens = torch.randint(0, model.config.vocab_size, (rows, seq + 1),
                                   generator=torch.Generator().manual_seed(seed + k))
            try:
                runs = {"prod": _run(model, tokens.to(device), prod_params, own_loss=True,
                                     seed=seed + k)}
            except NotRun:
                raise
            except Exception as e:  # the model's own code: a verdict on it
                checks.append(Check(f"{where}/step{k}.error", "fail", f"prod raised an "
                                        f"error at step {k}: {type(e).__name__}: {e}", None, None,
                                        f"step{k}.error"))
                break
            runs["base"] = _run(base, tokens.to(device), base_params, own_loss=True,
                                seed=seed + k)
            runs["ref"] = _run(ref, tokens, ref_params, own_loss=False, seed=seed + k)
            ref_grads = runs["ref"][2]
            for c in _judge_losses(runs, where):
                c.name = f"step{k}.{c.name}"
                c.path = f"{where}/{c.name}"
                c.message = c.message and f"step {k}: {c.message}"
                checks.append(c)
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
        embedding = model.get_input_embeddings().weight
    except (AttributeError, NotImplementedError):
        raise NotRun(f"{type(model).__name__} has no input embedding (get_input_embeddings)") \
            from None
    dtype, device = embedding.dtype, embedding.device
    dtype_name = name_of(dtype)
    if dtype_name not in ACTIVATION_DTYPES:
        raise NotRun(f"the model's embedding is {dtype}: expected fp32, fp16 or bf16")
    lora_bases = {id(lo.module.base_layer) for lo in loras}
    quantized = {path: m for path, m in model.named_modules()
                 if is_gptq(m) and id(m) not in lora_bases}
    dense = {lo.path: _dense_weight(f"{lo.path}.base_layer", lo.module.base_layer, zero_format)
             for lo in loras}
    dense.update({path: _dense_weight(path, m, zero_format) for path, m in quantized.items()})
    rows = max(batch, -(-MIN_TOKENS // seq))
    _check_memory(model, dense, rows, seq + 1, device, dtype)
    tokens = torch.randint(0, model.config.vocab_size, (rows, seq + 1),
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
        return Case(where, "model", "fail",
                        [Check(f"{where}/error", "fail", message, None, None, "error")],
                        replay)
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
    checks = _judge_losses(runs, where)
    judged = []  # (name, prod, base, ref) of each gradient the model's loss reaches
    for i, (name, param) in enumerate(zip(names, prod_params)):
        if ref_grads[i] is None or runs["base"][2][i] is None:
            continue  # the adapter is not in the loss's graph, in the plain model either
        judged.append((name, runs["prod"][2][i], runs["base"][2][i], ref_grads[i]))
        checks.append(_judge_tensor(name, runs["prod"][2][i], runs["base"][2][i], ref_grads[i],
                                    param.dtype, where))
    if steps:
        checks += _judge_steps(model, prod_params, copies, runs["ref"][2], rows, seq, seed,
                               steps, lr, where)
    case = Case(where, "model", "pass" if all(c.passed for c in checks) else "fail",
                    checks, replay)
    if dump:
        tensors = {"per_token_loss": tuple(runs[r][1] for r in ("prod", "base", "ref")),
                   "loss": tuple(runs[r][0].reshape(1) for r in ("prod", "base", "ref"))}
        tensors.update({name: (p, b, r) for name, p, b, r in judged if p is not None})
        write_dump(dump, case, tensors, dtype_name, device.type)
    return case
