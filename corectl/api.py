"""The typed admin API client: one method per endpoint, with the request and answer models the daemon serves
(coderouterd.admin.apitype).

The transport (HTTP over the Unix socket, the version check, errors as CorectlError) is client.AdminClient;
this module is the only place that knows the endpoints' paths and bodies, so commands never build requests.

Two kinds of method, on measurement (docs/decisions.md, "corectl and the admin API's models"): the fast-path
commands (`status`, `reload`, `profile list/show/use`, run before Typer is imported) get the plain JSON answer,
because importing pydantic and building the models would spend ~100 ms of `corectl status`'s 250 ms budget;
the type checker still reads their shapes from apitype. Every other method builds its body with the request
model and returns the answer validated into its model, so a daemon whose answer this corectl would misread
fails with one line naming the field, not a KeyError in a table."""

from __future__ import annotations

from urllib.parse import quote

from .client import DEFAULT_TIMEOUT_S, AdminClient, CorectlError, resolve_socket

# Not `from typing import TYPE_CHECKING`: typing costs the fast path ~4 ms, for names only a type checker reads.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pydantic import BaseModel

    from coderouterd.admin.apitype import (
        ConfigCheckAnswer,
        HistoryRequestsAnswer,
        ModelControlAnswer,
        ModelsAnswer,
        ProcessActionAnswer,
        ProcessesAnswer,
        ProvidersAnswer,
        RequestsAnswer,
        SpendAnswer,
        Trace,
        TrendsAnswer,
    )


def _typed(model: type[BaseModel], method: str, path: str, data: dict):
    from pydantic import ValidationError

    try:
        return model.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "the answer"
        raise CorectlError(f"coderouterd's answer to {method} {path} is not what this corectl reads "
                           f"({where}: {first['msg']}); are corectl and coderouterd the same version?",
                           code=1, payload=data) from None


def _models():
    # Imported per call, not at the top: the fast path must not pay for pydantic (see the module's docstring).
    from coderouterd.admin import apitype

    return apitype


class DaemonAPI:
    def __init__(self, socket: str | None, *, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.transport = AdminClient(resolve_socket(socket), timeout=timeout)

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> DaemonAPI:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the fast path's endpoints: plain answers -----------------------------------------------------------------

    def status(self) -> dict:  # fast path: the plain answer, shaped as apitype.Status
        return self.transport.call("GET", "/v1/status")

    def reload(self) -> dict:  # fast path: the plain answer, shaped as apitype.ReloadAnswer
        """The reload's answer; a refused reload raises CorectlError carrying the daemon's reason."""
        code, data = self.transport.request("POST", "/v1/reload")
        if code >= 400 or not data.get("ok"):
            reason = data.get("error") or f"HTTP {code}"
            raise CorectlError(f"reload refused, the running configuration stays: {reason}", 1, data)
        return data

    def profiles(self) -> dict:  # fast path: the plain answer, shaped as apitype.ProfilesAnswer
        return self.transport.call("GET", "/v1/profiles")

    def profile(self, name: str) -> dict:  # fast path: the plain answer, shaped as apitype.ProfileDetail
        return self.transport.call("GET", f"/v1/profiles/{quote(name, safe='')}")

    def use_profile(self, name: str) -> dict:  # fast path: the plain answer, shaped as apitype.UseProfileAnswer
        return self.transport.call("POST", "/v1/profile/use", {"name": name})

    # -- providers, processes, models: typed answers ------------------------------------------------------------

    def _get(self, model: type[BaseModel], path: str):
        return _typed(model, "GET", path, self.transport.call("GET", path))

    def _post(self, model: type[BaseModel], path: str, body: BaseModel):
        return _typed(model, "POST", path, self.transport.call("POST", path, body.model_dump()))

    def config_check(self) -> ConfigCheckAnswer:
        return self._get(_models().ConfigCheckAnswer, "/v1/config/check")

    def providers(self) -> ProvidersAnswer:
        return self._get(_models().ProvidersAnswer, "/v1/providers")

    def processes(self) -> ProcessesAnswer:
        return self._get(_models().ProcessesAnswer, "/v1/processes")

    def process_action(self, name: str, action: str, wait_s: float) -> ProcessActionAnswer:
        m = _models()
        path = f"/v1/processes/{quote(name, safe='')}/{action}"
        return self._post(m.ProcessActionAnswer, path, m.ProcessActionRequest(wait_s=float(wait_s)))

    def models(self, provider: str | None = None) -> ModelsAnswer:
        path = "/v1/models" + (f"?provider={quote(provider, safe='')}" if provider else "")
        return self._get(_models().ModelsAnswer, path)

    def model_control(self, action: str, provider: str, model: str, *, force: bool = False) -> ModelControlAnswer:
        m = _models()
        return self._post(m.ModelControlAnswer, f"/v1/models/{action}",
                          m.ModelControlRequest(provider=provider, model=model, force=force))

    # -- recent requests ----------------------------------------------------------------------------------------

    def requests(self, limit: int) -> RequestsAnswer:
        return self._get(_models().RequestsAnswer, f"/v1/requests?limit={int(limit)}")

    def request(self, request_id: str) -> Trace | None:
        """A recent request's decision trace, or None when the daemon no longer holds it."""
        path = f"/v1/requests/{quote(request_id, safe='')}"
        code, data = self.transport.request("GET", path)
        if code == 404:
            return None
        if code >= 400:
            raise CorectlError(str(data.get("error") or f"HTTP {code}"), code=1, payload=data)
        return _typed(_models().Trace, "GET", path, data)

    # -- history (the journal's trends, as the dashboard shows them) ---------------------------------------------

    def history_spend(self) -> SpendAnswer:
        return self._get(_models().SpendAnswer, "/v1/history/spend")

    def history_trends(self, range_name: str = "24h") -> TrendsAnswer:
        return self._get(_models().TrendsAnswer, f"/v1/history/trends?range={quote(range_name, safe='')}")

    def history_requests(self, *, limit: int = 50, **filters: str | None) -> HistoryRequestsAnswer:
        """The last requests from the journal, newest first; filters: profile, provider, outcome."""
        query = "&".join(f"{k}={quote(v, safe='')}" for k, v in filters.items() if v)
        return self._get(_models().HistoryRequestsAnswer, f"/v1/history/requests?limit={int(limit)}"
                         + (f"&{query}" if query else ""))

    # -- team keys ----------------------------------------------------------------------------------------------

    def keys(self):
        return self._get(_models().KeysAnswer, "/v1/keys")

    def key(self, name: str):
        return self._get(_models().KeyAnswer, f"/v1/keys/{quote(name, safe='')}")

    def key_create(self, name: str, settings: dict):
        m = _models()
        body = m.KeyCreateRequest.model_validate({"name": name, **settings})
        return _typed(m.KeySecretAnswer, "POST", "/v1/keys",
                      self.transport.call("POST", "/v1/keys", body.model_dump(exclude_unset=True)))

    def key_update(self, name: str, settings: dict):
        m = _models()
        path = f"/v1/keys/{quote(name, safe='')}/update"
        body = m.KeySettings.model_validate(settings)
        return _typed(m.KeyAnswer, "POST", path, self.transport.call("POST", path, body.model_dump(exclude_unset=True)))

    def key_rotate(self, name: str, grace_s: float):
        m = _models()
        return self._post(m.KeySecretAnswer, f"/v1/keys/{quote(name, safe='')}/rotate",
                          m.KeyRotateRequest(grace_s=float(grace_s)))

    def key_delete(self, name: str):
        path = f"/v1/keys/{quote(name, safe='')}/delete"
        return _typed(_models().KeyDeleteAnswer, "POST", path, self.transport.call("POST", path, {}))

    def key_revoke(self, name: str):
        path = f"/v1/keys/{quote(name, safe='')}/revoke"
        return _typed(_models().KeyAnswer, "POST", path, self.transport.call("POST", path, {}))
