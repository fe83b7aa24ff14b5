"""End to end on correct models across seeds (docs/verification.md, "End to end").

The 4-layer Llama of tests/python/test_model_llama.py (lora_models.llama_r16, small shape), held
in fp16, over bases that use another GEMM layout (TransposedGemm: correct, rounding differently
from the baseline on the CPU), seeds 1-8 (the model's initialisation and the token ids).
Prints, per seed, the verdict and the largest err/limit of the gradient checks and of the
per-token loss.
Run: PYTHONPATH=build/python:tests/python python3 scripts/end_to_end_specificity.py
"""
import torch
from lora_models import TransposedGemm, llama_r16
import gradscope
for seed in range(1, 9):
    model = llama_r16(dtype=torch.float16, base=TransposedGemm, seed=seed)
    r = gradscope.check_model(model, dtypes=["fp16"], end_to_end=True, seed=seed,
                              raise_on_failure=False)
    checks = r.modules[-1].cases[0].checks
    ratio = {k.name: k.max_abs / k.limit if k.limit else float("inf") for k in checks}
    grads = max(v for name, v in ratio.items() if name.endswith(".grad"))
    tokens = ratio["per_token_loss"]
    print(f"seed {seed}: {'pass' if r.passed else 'FAIL'} ({r.modules[-1].cases[0].id}), "
          f"gradients worst err/limit {grads:.3f}, per-token loss {tokens:.3f}")
