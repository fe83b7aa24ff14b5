"""gradscope's dtype table (common/dtype_table.h) as torch sees it: names, torch dtypes and
assert_close's tolerances, read from the engine, never written here."""
from __future__ import annotations

from typing import Dict, Optional

import torch

from ._gradscope import DTYPES, DtypeFacts, kinds

# ATen's type names are torch's attribute names for them in lower case (torch.half, torch.long).
_BY_NAME: Dict[str, DtypeFacts] = {d.name: d for d in DTYPES}
_BY_TORCH: Dict[torch.dtype, DtypeFacts] = {getattr(torch, d.aten.lower()): d for d in DTYPES}

# The activation dtypes a case takes: the common field `dtype`'s choices.
ACTIVATION_DTYPES = tuple(next(f for f in kinds()[0].fields if f.name == "dtype").choices)


def facts(name: str) -> DtypeFacts:
    """The table's row for a name (fp32, fp16, bf16, fp64, int32, int64); KeyError otherwise."""
    return _BY_NAME[name]


def name_of(dtype: torch.dtype) -> Optional[str]:
    """The table's name of a torch dtype, or None for a type outside the table."""
    row = _BY_TORCH.get(dtype)
    return row.name if row else None


def torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, facts(name).aten.lower())
