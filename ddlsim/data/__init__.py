"""Specs, the iteration-graph format, the model zoo, the store and the shipped datasets.

The lowest layer of ddlsim: everything else imports from here, and this package imports only
torch, torch_geometric, transformers (to build zoo models) and the standard library.
"""

from ddlsim.data.errors import (
    DdlsimError,
    InvalidClusterError,
    InvalidGraphError,
    InvalidModelSpecError,
    InvalidOptionError,
    InvalidStrategyError,
    UnknownModelError,
)

__all__ = [
    "DdlsimError",
    "InvalidClusterError",
    "InvalidGraphError",
    "InvalidModelSpecError",
    "InvalidOptionError",
    "InvalidStrategyError",
    "UnknownModelError",
]
