"""The smoke suite against plausible bugs of a third party's kernels, none in gradscope's fault
list: each a namespace of tests/python/third_party_bugs.py or tail_and_pair_bugs.py, run by
`python -m gradscope run FILES --quiet --impl BUG --import MODULE --device DEVICE` (--device).

1. Each bug of third_party_bugs but bf16_via_fp16 fails (exit 1) the smoke lora_w,
   lora_w_variants, mlp_formats, realistic_lora and range_adapter_grads files.
2. mask_from_zeros passes the smoke lora_w and qkv files (continuous inputs hide it) and fails
   range_zero_inputs (exact zeros show it); bf16_via_fp16 passes the smoke lora_w and mlp files
   (ordinary bf16 values hide an fp16 intermediate) and fails range_small_values (values below
   fp16's range show it).
3. Each bug of tail_and_pair_bugs fails the whole smoke suite, its pairs_ and tails_ files ahead,
   stopping at the first failing case (--fail-fast); tail_and_pair_correct, the same
   implementation without a bug, passes those pairs_ and tails_ files.
"""
from __future__ import annotations

import glob
import os
from typing import Callable, List, Sequence

import pytest
import tail_and_pair_bugs
import third_party_bugs

Smoke = Callable[..., List[str]]


@pytest.fixture(scope="session")
def smoke(cases_dir: str) -> Smoke:
    """The smoke files of these names."""
    def smoke(*names: str) -> List[str]:
        return [os.path.join(cases_dir, "smoke", f + ".toml") for f in names]
    return smoke


@pytest.fixture(scope="session")
def tail_and_pair_files(cases_dir: str) -> List[str]:
    """Every smoke file, the pairs_ and tails_ files ahead (the run stops at the first
    failure)."""
    files = sorted(glob.glob(os.path.join(cases_dir, "smoke", "*.toml")))
    ahead = [f for f in files if os.path.basename(f).startswith(("pairs_", "tails_"))]
    return ahead + [f for f in files if f not in ahead]


def expect(bug: str, module: str, files: Sequence[str], expected: int, device: str,
           *extra: str) -> None:
    p, summary = third_party_bugs.gradscope_run(bug, module, files, *extra, "--device", device)
    print(f"{bug} over {len(files)} files: exit {p.returncode} (expected {expected}); "
          f"{summary}")
    assert p.returncode == expected, p.stdout + p.stderr


@pytest.mark.parametrize("bug", [b for b in third_party_bugs.BUGS if b != "bf16_via_fp16"])
def test_a_third_party_bug_fails_the_smoke_files(smoke: Smoke, device: str, bug: str) -> None:
    files = smoke("lora_w", "lora_w_variants", "mlp_formats", "realistic_lora",
                  "range_adapter_grads")
    expect(bug, "third_party_bugs", files, 1, device)


@pytest.mark.parametrize("bug, names, expected", [
    # Continuous inputs hide it (the MLP's h is no such input: its fp16/bf16 products
    # underflow to exact zeros, and the files above catch the bug there)...
    ("mask_from_zeros", ("lora_w", "qkv"), 0),
    # ... and activations with exact zeros show it.
    ("mask_from_zeros", ("range_zero_inputs",), 1),
    # Ordinary bf16 values hide an fp16 intermediate; values below fp16's range show it.
    ("bf16_via_fp16", ("lora_w", "mlp"), 0),
    ("bf16_via_fp16", ("range_small_values",), 1),
], ids=["mask_from_zeros-hidden", "mask_from_zeros-shown", "bf16_via_fp16-hidden",
        "bf16_via_fp16-shown"])
def test_a_bug_hidden_by_ordinary_inputs_is_shown_by_its_file(smoke: Smoke, device: str,
                                                               bug: str, names: Sequence[str],
                                                               expected: int) -> None:
    expect(bug, "third_party_bugs", smoke(*names), expected, device)


@pytest.mark.parametrize("bug", tail_and_pair_bugs.BUGS)
def test_a_tail_or_pair_bug_fails_the_smoke_suite(tail_and_pair_files: List[str], device: str,
                                                  bug: str) -> None:
    expect(bug, "tail_and_pair_bugs", tail_and_pair_files, 1, device, "--fail-fast")


def test_the_same_implementation_without_a_bug_passes_their_files(
        tail_and_pair_files: List[str], device: str) -> None:
    files = [f for f in tail_and_pair_files
             if os.path.basename(f).startswith(("pairs_", "tails_"))]
    expect("tail_and_pair_correct", "tail_and_pair_bugs", files, 0, device)
