"""The wires as bytes and shapes, shared by ingress, routing, providers and translate: SSE encoding and parsing,
error kinds, Anthropic stream events built in more than one place."""
