#!/usr/bin/env python3
"""Follows docs/architecture.md "Adding a model family" as written: the doc's declaration
becomes a file in a families folder of its own (GRADSCOPE_FAMILIES_DIR, beside copies of the
shipped ones, as step 2 allows), a model of the family is built with LoRA over GPTQ bases, and
the doc's Python block runs on one of its layers and on the model. Then what the doc says of
the declaration: without it the layer is refused; declared with the default residual, it fails
on hidden/output.

Usage: python3 scripts/follow-adding-a-family.py   (gradscope and tests/python on PYTHONPATH;
transformers, peft). Exit 0 when every step did what the doc says. Touches no tracked file.
"""
from __future__ import annotations

import os
import pathlib
import re
import shutil
import sys
import tempfile
from typing import Any, Dict

ROOT = pathlib.Path(__file__).resolve().parent.parent


def section() -> str:
    text = (ROOT / "docs/architecture.md").read_text()
    start = text.index("## Adding a model family")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def block(doc: str, lang: str) -> str:
    found = re.findall(r"```" + lang + r"\n(.*?)```", doc, re.S)
    if len(found) != 1:
        raise SystemExit(f"the doc's section has {len(found)} ```{lang} blocks, expected one")
    return "\n".join(line[3:] if line.startswith("   ") else line
                     for line in found[0].splitlines()) + "\n"


def main() -> None:
    doc = section()
    name = re.search(r"in a new file `families/(\w+)\.toml`", doc).group(1)
    declaration = block(doc, "toml")
    model_type = re.search(r'model_types = \["(\w+)"\]', declaration).group(1)
    attribute = re.search(r'multiplier = "config\.(\w+)"', declaration).group(1)

    import torch
    from lora_models import LLAMA_SIZES, lora, quant
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    import gradscope

    # The family's own code, as its authors would ship it: a config class of its model_type and
    # a layer that scales each residual branch by the config's attribute.
    class ToyConfig(LlamaConfig):
        model_type = "toy"  # replaced below by the declaration's

    ToyConfig.model_type = model_type

    class ToyDecoderLayer(LlamaDecoderLayer):
        def forward(self, hidden_states, attention_mask=None, position_ids=None,
                    position_embeddings=None, **kwargs):
            scale = getattr(self.self_attn.config, attribute)
            attn, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states),
                                     attention_mask=attention_mask, position_ids=position_ids,
                                     position_embeddings=position_embeddings, **kwargs)
            h = hidden_states + attn * scale
            return h + self.mlp(self.post_attention_layernorm(h)) * scale

    config = ToyConfig(hidden_size=128, intermediate_size=352, num_attention_heads=4,
                       num_key_value_heads=2, num_hidden_layers=2, vocab_size=64)
    setattr(config, attribute, 0.5)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.model.layers = torch.nn.ModuleList(ToyDecoderLayer(config, i) for i in range(2))
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for proj, (i, o) in LLAMA_SIZES.items():
                if hasattr(parent, proj):
                    setattr(parent, proj, lora(quant(i, o, group=32), r=4, alpha=8.0))
    layer = model.model.layers[0]

    with tempfile.TemporaryDirectory(prefix="gradscope-families-") as tmp:
        folder = pathlib.Path(tmp)
        for shipped in (ROOT / "families").glob("*.toml"):
            shutil.copy(shipped, folder)

        # Without the declaration: refused by name.
        os.environ["GRADSCOPE_FAMILIES_DIR"] = str(folder)
        try:
            gradscope.check_module(layer)
            raise SystemExit("an undeclared family was judged")
        except gradscope.ModuleRefused as e:
            refusal = str(e)
        if "declared by no model family" not in refusal:
            raise SystemExit(f"refused for another reason: {refusal}")
        print(f"without families/{name}.toml: refused ({refusal[:100]}...)")

        # Step 2, literally, then step 3's block.
        (folder / f"{name}.toml").write_text(declaration)
        names = [f.name for f in gradscope.families()]
        if name not in names:
            raise SystemExit(f"{name} is not among the families read: {names}")
        scope: Dict[str, Any] = {"layer": layer, "model": model}
        exec(compile(block(doc, "python"), "docs/architecture.md", "exec"), scope)
        report = scope["report"]
        kinds = sorted({m.kind for m in report.modules})
        print(f"with families/{name}.toml: check_module passes "
              f"({', '.join(c.id for c in scope['cases'])}); check_model(by='layer') passes, "
              f"{len(report.modules)} modules of kind {', '.join(kinds)}")
        if not all(f".{name}." in c.id for c in scope["cases"]):
            raise SystemExit("the cases were not of the declared family")

        # The declaration is what the layer is judged against: read as plain residuals, the
        # same layer fails.
        (folder / f"{name}.toml").write_text(
            declaration.replace(f'multiplier = "config.{attribute}"', 'multiplier = "default"'))
        cases = gradscope.check_module(layer, dtypes="fp32", raise_on_failure=False)
        failed = [c.path for case in cases for c in case.checks if c.status == "fail"]
        if not any(p.endswith("hidden/output") for p in failed):
            raise SystemExit(f"declared with plain residuals, the layer was not caught: {failed}")
        print(f"declared with multiplier = \"default\": fails on {len(failed)} checks, "
              f"{failed[0]} first")
    print("follow-adding-a-family: every step did what docs/architecture.md says")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "tests/python"))
    main()
