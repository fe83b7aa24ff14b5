"""`python -m gradscope ARGS`: the gradscope command line in this process, plus `--import MODULE`
(repeatable: modules that register an implementation's operators, imported first) and the
package's own `model` command (model_command.py)."""
from __future__ import annotations

import sys
from typing import List, Optional, Sequence, Tuple

from . import _gradscope
from .api import import_modules
from .errors import GradscopeInputError

# The commands that take --import: they run an implementation and print replay lines naming
# its modules. Elsewhere --import only imports.
_COMMANDS_NAMING_IMPORTS = ("run", "sample")


def _split_imports(argv: Sequence[str]) -> Tuple[List[str], List[str]]:
    """Takes every `--import MODULE` (or --import=MODULE) out of argv."""
    imports: List[str] = []
    rest: List[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--import":
            if i + 1 >= len(argv):
                raise GradscopeInputError("--import needs a module name")
            imports.append(argv[i + 1])
            i += 2
            continue
        if a.startswith("--import="):
            imports.append(a.split("=", 1)[1])
        else:
            rest.append(a)
        i += 1
    return imports, rest


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`python -m gradscope ARGS`: the gradscope command line, plus --import MODULE."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        imports, rest = _split_imports(args)
        import_modules(imports)
    except GradscopeInputError as e:
        print(f"gradscope: {e}", file=sys.stderr)
        return 2
    if rest and rest[0] == "model":  # the Python package's own command (model_command.py)
        from .model_command import main as model_main

        return model_main(rest[1:])
    if rest and rest[0] in _COMMANDS_NAMING_IMPORTS:
        for name in imports:
            rest += ["--import", name]
    sys.stdout.flush()
    sys.stderr.flush()
    return _gradscope.run_cli(rest)
