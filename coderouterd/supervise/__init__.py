"""Managed child processes: local model servers the daemon starts, watches, restarts and stops."""

from .logs import RotatingLog
from .process import ManagedProcess
from .registry import Supervisor
from .spec import (
    DEFAULT_BACKOFF,
    TRANSITIONS,
    ExternalProcessError,
    IllegalTransition,
    ProcessEventName,
    ProcessSpec,
    ProcessState,
    SupervisorError,
    http_ready,
)
from .tree import kill_tree, kill_tree_now, process_alive

__all__ = [
    "DEFAULT_BACKOFF",
    "TRANSITIONS",
    "ExternalProcessError",
    "IllegalTransition",
    "ProcessEventName",
    "ManagedProcess",
    "ProcessSpec",
    "ProcessState",
    "RotatingLog",
    "Supervisor",
    "SupervisorError",
    "http_ready",
    "kill_tree",
    "kill_tree_now",
    "process_alive",
]
