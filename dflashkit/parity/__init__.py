"""`dflash-parity`: does the candidate file still draft the same tokens as the reference?

- `run` — the run (`run_parity`): both drafters on identical inputs, round after round, and the ``--dump`` file;
- `stats` — the figures compared (logits, hidden states, the accepted prefix), pure functions of tensors;
- `result` — what was measured, its verdict, its gates and its report (`ParityResult`).

The names a user imports from ``dflashkit.parity`` are re-exported here.
"""

from .result import EXIT_FAILED, EXIT_OK, MODES, ParityResult, RoundResult
from .run import CONTEXT_LEN, run_parity
from .stats import TOP_K, HiddenStats, LogitStats, accepted_prefix

__all__ = ["CONTEXT_LEN", "run_parity", "TOP_K", "HiddenStats", "LogitStats", "accepted_prefix", "EXIT_FAILED",
           "EXIT_OK", "MODES", "ParityResult", "RoundResult"]
