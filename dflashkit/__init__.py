"""dflashkit: tools for DFlash speculative-decoding drafters (convert, quantize, inspect, diff, run)."""

__version__ = "0.1.0"
