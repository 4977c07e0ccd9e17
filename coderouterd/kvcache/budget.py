"""The disk budget against one slot file, pure: a budget smaller than one file (`affinity.max_saved_mb`) writes
every such save and deletes it at once. Said at start-up (a warning and an audit record) and by `corectl config
check`; what one file of a server takes is estimated from its model's header by supervise/memory.py."""

from __future__ import annotations

MB = 1024 * 1024


def too_small(budget_mb: float, process: str, file_bytes: int, tokens: int) -> str | None:
    """The note for a process whose slot file, with its slot full (`tokens`), would not fit the budget."""
    if file_bytes <= 0 or file_bytes <= budget_mb * MB:
        return None
    return (f"process {process}: affinity.max_saved_mb = {budget_mb:g} is smaller than one of its slot files with "
            f"its slot full ({tokens:,} tokens, about {file_bytes / MB:,.0f} MB): such a save is written and deleted "
            f"at once, and the lane starts over after a stop (raise max_saved_mb, or set max_saved_slots = 0)")
