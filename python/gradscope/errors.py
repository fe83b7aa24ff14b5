"""The package's exceptions: GradscopeInputError is the engine's own (bad input, a case that
cannot be judged: what the command line exits 2 for), raised through the binding."""
from ._gradscope import GradscopeInputError


class ModuleRefused(GradscopeInputError):
    """The module has a feature gradscope's reference does not model, or is not one it reads."""


__all__ = ["GradscopeInputError", "ModuleRefused"]
