"""Command-line entry points, one module per command. Thin: parse, call the library, print.

Errors: one line on stderr, exit 1 for bad input and 2 for usage; ``--debug`` shows the traceback (`common`).
``dflashkit.cli:<name>_command`` is each console script's entry point.
"""

from .accept import accept_command
from .convert import convert_command
from .diff import diff_command
from .imatrix import imatrix_command
from .inspect import inspect_command
from .parity import parity_command
from .quantize import quantize_command
from .release import release_command

__all__ = ["accept_command", "convert_command", "diff_command", "imatrix_command", "inspect_command",
           "parity_command", "quantize_command", "release_command"]
