"""Request guards: the tool-loop detector and the monthly budget ledger."""

from coderouterd.guards.budget import Budget, Reservation
from coderouterd.guards.tool_loop import LoopFinding, check, detect, inject

__all__ = ["Budget", "LoopFinding", "Reservation", "check", "detect", "inject"]
