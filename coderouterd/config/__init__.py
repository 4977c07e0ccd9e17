from .loader import (
    EMBEDDED,
    ConfigError,
    LoadedConfig,
    admin_socket_path,
    load_config,
    parse_config_text,
    state_dir,
)
from .schema import ConfigModel, ProfileConfig, ProviderConfig

__all__ = [
    "EMBEDDED",
    "ConfigError",
    "ConfigModel",
    "LoadedConfig",
    "ProfileConfig",
    "ProviderConfig",
    "admin_socket_path",
    "load_config",
    "parse_config_text",
    "state_dir",
]
