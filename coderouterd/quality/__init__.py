"""Answer quality: a local model whose answers drift from its own normal (detected, then acted on)."""
