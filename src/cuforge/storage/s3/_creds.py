"""AWS credentials and region from the standard places, never from a cache URL.

Order, as the AWS tools use it: ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``
(``AWS_SESSION_TOKEN``) in the environment; else the profile ``AWS_PROFILE`` (or
``default``) of the shared credentials file (``AWS_SHARED_CREDENTIALS_FILE``, else
``~/.aws/credentials``) and of the config file (``AWS_CONFIG_FILE``, else
``~/.aws/config``, where the section is ``[profile NAME]``). Region: the URL's
``region``, else ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, else the profile's
``region``. Anything not found here is left to the client (instance metadata,
web identity), which reads it lazily.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["profile_settings"]

_KEYS = {
    "aws_access_key_id": "access_key_id",
    "aws_secret_access_key": "secret_access_key",
    "aws_session_token": "session_token",
    "region": "region",
}


def _read(path: str, section: str) -> dict[str, str]:
    try:  # most hosts of a job have no such file: configparser (~3 ms) not imported
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError):
        return {}
    import configparser

    parser = configparser.RawConfigParser()
    try:
        parser.read_string(text, path)
    except configparser.Error:
        return {}
    if not parser.has_section(section):
        return {}
    return {_KEYS[k]: v.strip() for k, v in parser.items(section) if k in _KEYS and v.strip()}


def profile_settings() -> dict[str, str]:
    """``access_key_id``, ``secret_access_key``, ``session_token``, ``region`` found in
    the profile files, for whatever the environment does not set itself."""
    env = os.environ
    home = Path.home() if "HOME" in env or os.name != "posix" else Path("/nonexistent")
    profile = env.get("AWS_PROFILE") or env.get("AWS_DEFAULT_PROFILE") or "default"
    found: dict[str, str] = {}
    config = env.get("AWS_CONFIG_FILE") or str(home / ".aws" / "config")
    section = profile if profile == "default" else f"profile {profile}"
    found.update(_read(config, section))
    if not env.get("AWS_ACCESS_KEY_ID"):
        creds = env.get("AWS_SHARED_CREDENTIALS_FILE") or str(home / ".aws" / "credentials")
        found.update({k: v for k, v in _read(creds, profile).items() if k != "region"})
    else:
        for name in ("access_key_id", "secret_access_key", "session_token"):
            found.pop(name, None)
    return found
