"""One object per provider for its upstream: breaker, hold, last probe, in-flight count and lifecycle (upstream.py,
lifecycle.py); the breaker and the clocks it reads (breaker.py, clock.py). Below routing, which plans over these,
and below supervise and health, which move them."""
