"""Types of the extension gradscope._gradscope (python/src/gradscope_module.cpp)."""
import enum
from typing import Any, Dict, List, Optional, Sequence, Tuple

class GradscopeInputError(ValueError): ...

OP_SCHEMAS: Dict[str, str]
OP_SCHEMA_VERSION: int
FAULT_SWITCHES: bool

class DtypeFacts:
    @property
    def name(self) -> str: ...
    floating: bool
    unit_roundoff: float
    epsilon: float
    max: float
    rtol: float
    atol: float
    @property
    def aten(self) -> str: ...

DTYPES: List[DtypeFacts]
LAYER_PROJECTIONS: List[Tuple[str, str]]

class Field:
    name: str
    @property
    def type(self) -> str: ...
    @property
    def default(self) -> Any: ...
    doc: str
    @property
    def choices(self) -> List[Any]: ...
    min: Optional[float]
    max: Optional[float]

class Kind:
    @property
    def name(self) -> str: ...
    @property
    def fields(self) -> List[Field]: ...
    @property
    def sampled(self) -> bool: ...

def kinds() -> List[Kind]: ...

class FamilyNorms:
    kind: str
    eps: str

class FamilyRope:
    types: List[str]
    theta: str

class FamilyAttention:
    heads: str
    kv_heads: str
    mask: str
    @property
    def scaling(self) -> Optional[str]: ...
    @property
    def sliding_window(self) -> Optional[str]: ...

class ModelFamily:
    name: str
    file: str
    description: str
    model_types: List[str]
    norms: FamilyNorms
    rope: FamilyRope
    attention: FamilyAttention
    @property
    def activation(self) -> str: ...
    @property
    def residual_multiplier(self) -> Optional[str]: ...
    self_attn: List[str]
    mlp: List[str]

def families() -> List[ModelFamily]: ...
def families_dir() -> str: ...

class CheckStatus(enum.Enum):
    PASS = 0
    FAIL = 1
    OUT_OF_RANGE = 2

class Outcome(enum.Enum):
    PASS = 0
    FAIL = 1
    INVALID = 2
    UNSUPPORTED = 3

class Check:
    path: str
    @property
    def status(self) -> CheckStatus: ...
    exact: bool
    @property
    def statistic(self) -> str: ...
    @property
    def gated_error(self) -> float: ...
    numel: int
    mismatches: int
    max_abs: float
    mean_abs: float
    baseline_max_abs: Optional[float]
    limit: float
    floor: Optional[float]
    error_to_limit: Optional[float]
    note: str
    @property
    def message(self) -> str: ...

class CaseResult:
    id: str
    kind: str
    @property
    def outcome(self) -> Outcome: ...
    checks: List[Check]
    replay: str
    input_error: str
    unsupported: str
    seconds: float
    @property
    def spec(self) -> Dict[str, Any]: ...
    @property
    def metrics(self) -> Dict[str, float]: ...

class Case:
    id: str
    @property
    def kind(self) -> str: ...
    @property
    def fields(self) -> Dict[str, Any]: ...
    @property
    def inputs(self) -> List[str]: ...
    @property
    def gradients(self) -> List[Tuple[str, str]]: ...
    @property
    def parts(self) -> List[Tuple[str, str, int]]: ...
    def with_tensors(self, tensors: Dict[str, Any], source: str) -> Case: ...

def build_cases(kind: str, fields: Dict[str, Any], matrix: Dict[str, Sequence[Any]] = ...,
                *, origin: str) -> List[Case]: ...
def select_cases(files: Sequence[str], suite: str = ..., filters: Sequence[str] = ...,
                 device: str = ..., dtype: str = ..., seed: int = ...) -> List[Case]: ...

class RunArgs:
    impl: str
    ops_libraries: List[str]
    imports: List[str]
    json: str
    dump: str
    junit: str
    html: str
    console: bool
    quiet: bool
    allow_unsupported: bool
    fail_fast: bool
    program: str
    def __init__(self) -> None: ...

class RunVerdict:
    exit_code: int
    message: str

def run(cases: Sequence[Case], args: RunArgs) -> Tuple[List[CaseResult], RunVerdict]: ...
def generate(case: Case) -> Dict[str, Any]: ...
def run_cli(args: Sequence[str], program: str = ...) -> int: ...

class EndToEndNotJudged(Exception): ...

def judge_gradient(where: str, name: str, prod: Optional[Any], base: Any, ref: Any,
                   expected: str, keep_tensors: bool = ...) -> Check: ...
def judge_losses(where: str, tensors: Dict[str, Any], prefix: str = ..., step: int = ...,
                 keep_tensors: bool = ...) -> List[Check]: ...
def model_case(id: str, replay: str, dtype: str, device: str, seed: int,
               checks: Sequence[Check]) -> CaseResult: ...
def failed_check(path: str, message: str) -> Check: ...
def write_dump(path: str, case: CaseResult, device: str) -> None: ...

class OutputError(OSError): ...

def write_model_reports(report: Any, title: str, json: str = ..., html: str = ...,
                        junit: str = ...) -> None: ...
