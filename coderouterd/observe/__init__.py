"""What the daemon tells about itself: the record of each finished request (journal event, the one log line,
the recent decision traces), Prometheus metrics and their endpoint, and the prompt-cache heuristic."""
