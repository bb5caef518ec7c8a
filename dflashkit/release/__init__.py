"""``dflash-release``: one command from a checkpoint to a checked, documented set of GGUFs (`run.release`), and
the check of a release folder (`check.check_release`). A composition of the library's own steps (`jobs`), local by
default, fanned out on Ray with the ``dflashkit[ray]`` extra."""

from .check import check_release
from .jobs import JobSpec, run_job
from .run import DEFAULT_TYPES, ReleaseResult, parse_types, release

__all__ = ["DEFAULT_TYPES", "JobSpec", "ReleaseResult", "check_release", "parse_types", "release", "run_job"]
