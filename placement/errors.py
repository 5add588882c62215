"""Errors raised by the placement package (all derive from `traces.EplbError`)."""

from traces.errors import EplbError


class PlacementInfeasibleError(EplbError):
    """The requested cluster cannot hold the model, or a solver found no placement under the constraints."""


class PlacementFormatError(EplbError):
    """A placement file or array is malformed or belongs to another model shape."""
