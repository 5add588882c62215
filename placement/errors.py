"""Errors raised by the placement package (all derive from `traces.EplbError`)."""

from traces.errors import EplbError


class PlacementInfeasibleError(EplbError, ValueError):
    """The requested cluster cannot hold the model, or a solver found no placement under the constraints.

    Also a `ValueError`: it always comes from the arguments (a shape, a count, an option), and callers of the drop-in
    policies (the engines in `eplb/engines/`) catch the built-in error for bad arguments.
    """


class PlacementFormatError(EplbError, ValueError):
    """A placement file or array is malformed or belongs to another model shape."""
