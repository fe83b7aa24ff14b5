"""Typed results: a case's outcome and each check's verdict, as the engine reports them.

`Case` and `Check` are what `check`, `check_module` and `check_model` return; their `status`
is the engine's word for the outcome (the same word the command line's reports write), and
`outcome` / `verdict` the engine's enums (`Outcome`, `CheckStatus`)."""
from __future__ import annotations

import dataclasses
from typing import List, Optional

from ._gradscope import CaseResult, CheckStatus, Outcome


@dataclasses.dataclass
class Check:
    path: str
    status: str  # CheckStatus as its word: pass, fail, out_of_range (not judged)
    message: str  # the failure message, or why it was not judged; empty when it passed
    max_abs: Optional[float]  # what the rule compares with limit: the worst |prod - ref|, its mean
    # where the rule gates on the mean, end to end a gradient's ||prod - ref|| (statistic)
    limit: Optional[float]  # what the rule allowed there
    name: str = ""  # check_module: the module's own path of the tensor (lora_A.default.weight.grad)
    # What max_abs measures: the largest |prod - ref|, or end to end (check_model) "frobenius"
    # (||prod - ref||), "mean_abs" (per-token losses) or "abs" (the model's loss).
    statistic: str = "max_abs"

    @property
    def verdict(self) -> CheckStatus:
        return CheckStatus[self.status.upper()]

    @property
    def passed(self) -> bool:
        return self.verdict is CheckStatus.PASS


@dataclasses.dataclass
class Case:
    id: str
    kind: str
    status: str  # Outcome as its word: pass, fail, invalid, unsupported
    checks: List[Check]
    replay: str
    unsupported: Optional[str] = None  # the implementation's message when it declined
    input_error: Optional[str] = None  # why it could not be judged

    @property
    def outcome(self) -> Outcome:
        return Outcome[self.status.upper()]

    @property
    def passed(self) -> bool:
        return self.outcome is Outcome.PASS


def word(value: "Outcome | CheckStatus") -> str:
    """The engine's word for an enum value (what its reports write)."""
    return value.name.lower()


def from_result(r: CaseResult) -> Case:
    """The engine's result of one case as the package's record."""
    return Case(
        id=r.id, kind=r.kind, status=word(r.outcome), replay=r.replay,
        unsupported=r.unsupported or None, input_error=r.input_error or None,
        checks=[Check(path=k.path, status=word(k.status), message=k.message,
                      max_abs=k.gated_error, limit=k.limit, statistic=k.statistic)
                for k in r.checks])


def failure_lines(case: Case, named: bool = False) -> List[str]:
    """A failing case as gradscope reports it: its id, each failing check's message (after the
    tensor's `name` when `named`), how many were not judged, the replay line."""
    lines = [f"{case.id}:"]
    lines += [f"  {k.name}: {k.message}" if named else f"  {k.message}"
              for k in case.checks if k.verdict is CheckStatus.FAIL]
    not_judged = sum(k.verdict is CheckStatus.OUT_OF_RANGE for k in case.checks)
    if not_judged:
        lines.append(f"  ({not_judged} more checks not judged: out of range, or past the "
                     "floor's model)")
    lines.append(f"  replay: {case.replay}")
    return lines
