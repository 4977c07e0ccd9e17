"""Team keys: a key of their own for each member of a team, each with a budget, rate limits, a scope and an expiry
(issue 41). `model` is the one shape every layer reads; storage, checking and limits live beside it."""
