"""Adapters that register a peer's implementation as an operator namespace (--impl), each
importing the peer's installed package: `--import gradscope.adapters.peft`."""
