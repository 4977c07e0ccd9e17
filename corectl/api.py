"""The typed admin API client: one method per endpoint, answers typed by coderouterd.admin.apitype.

The transport (HTTP over the Unix socket, the version check, errors as CorectlError) is client.AdminClient;
this module is the only place that knows the endpoints' paths and bodies, so commands never build requests."""

from __future__ import annotations

from urllib.parse import quote

from .client import DEFAULT_TIMEOUT_S, AdminClient, CorectlError, resolve_socket

# Not `from typing import TYPE_CHECKING`: typing costs the fast path ~4 ms, for names only a type checker reads.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from coderouterd.admin.apitype import (
        ConfigCheckAnswer,
        ModelControlAnswer,
        ModelsAnswer,
        ProcessActionAnswer,
        ProcessesAnswer,
        ProfileDetail,
        ProfilesAnswer,
        ProvidersAnswer,
        ReloadAnswer,
        RequestsAnswer,
        Status,
        Trace,
        UseProfileAnswer,
    )


class DaemonAPI:
    def __init__(self, socket: str | None, *, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.transport = AdminClient(resolve_socket(socket), timeout=timeout)

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> DaemonAPI:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- daemon -------------------------------------------------------------------------------------------------

    def status(self) -> Status:
        return self.transport.call("GET", "/v1/status")

    def reload(self) -> ReloadAnswer:
        """The reload's answer; a refused reload raises CorectlError carrying the daemon's reason."""
        code, data = self.transport.request("POST", "/v1/reload")
        if code >= 400 or not data.get("ok"):
            reason = data.get("error") or f"HTTP {code}"
            raise CorectlError(f"reload refused, the running configuration stays: {reason}", 1, data)
        return data

    def config_check(self) -> ConfigCheckAnswer:
        return self.transport.call("GET", "/v1/config/check")

    # -- profiles -----------------------------------------------------------------------------------------------

    def profiles(self) -> ProfilesAnswer:
        return self.transport.call("GET", "/v1/profiles")

    def profile(self, name: str) -> ProfileDetail:
        return self.transport.call("GET", f"/v1/profiles/{quote(name, safe='')}")

    def use_profile(self, name: str) -> UseProfileAnswer:
        return self.transport.call("POST", "/v1/profile/use", {"name": name})

    # -- providers, processes, models ---------------------------------------------------------------------------

    def providers(self) -> ProvidersAnswer:
        return self.transport.call("GET", "/v1/providers")

    def processes(self) -> ProcessesAnswer:
        return self.transport.call("GET", "/v1/processes")

    def process_action(self, name: str, action: str, wait_s: float) -> ProcessActionAnswer:
        path = f"/v1/processes/{quote(name, safe='')}/{action}"
        return self.transport.call("POST", path, {"wait_s": wait_s})

    def models(self, provider: str | None = None) -> ModelsAnswer:
        path = "/v1/models" + (f"?provider={quote(provider, safe='')}" if provider else "")
        return self.transport.call("GET", path)

    def model_control(self, action: str, provider: str, model: str, *, force: bool = False) -> ModelControlAnswer:
        body = {"provider": provider, "model": model, **({"force": True} if force else {})}
        return self.transport.call("POST", f"/v1/models/{action}", body)

    # -- recent requests ----------------------------------------------------------------------------------------

    def requests(self, limit: int) -> RequestsAnswer:
        return self.transport.call("GET", f"/v1/requests?limit={int(limit)}")

    def request(self, request_id: str) -> Trace | None:
        """A recent request's decision trace, or None when the daemon no longer holds it."""
        code, data = self.transport.request("GET", f"/v1/requests/{quote(request_id, safe='')}")
        if code == 404:
            return None
        if code >= 400:
            raise CorectlError(str(data.get("error") or f"HTTP {code}"), code=1, payload=data)
        return data
