"""corectl: the command line of coderouterd — a thin client of the daemon's admin API on its Unix socket."""

from coderouterd import __version__

__all__ = ["__version__"]
