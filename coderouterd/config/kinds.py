"""The facts about a provider kind that the config itself needs (to validate `serves_responses` and keys, to
answer `is_local()`, to default a hosted API's base_url). They live here, below providers/: the adapters (providers/adapters/) read them from
this table, so the config schema never imports the providers it configures."""

from __future__ import annotations

# Kinds that may forward Responses requests untranslated (`serves_responses = true`): the OpenAI wire.
SERVES_RESPONSES = frozenset({"openai"})
# Kinds whose backend is on this machine by definition (config `local` unset): memory, drift, tool repair.
ALWAYS_LOCAL = frozenset({"ollama"})
# Where a kind's API lives when the config gives no base_url (a hosted API with one public address).
DEFAULT_BASE_URL = {"gemini": "https://generativelanguage.googleapis.com"}
# Kinds whose hosted API answers nothing without a key: at a host ending so, api_key_env is required.
KEYED_HOSTS = {"gemini": ".googleapis.com"}
