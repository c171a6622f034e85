"""cuforge's loggers, without importing ``logging`` on the hit path.

``logging`` costs a fresh process several milliseconds of imports. Nothing can
listen to a logger before the ``logging`` module exists, so :func:`debug_enabled`
answers False without importing it; once the application has imported logging,
the answer is the logger's own. The ``cuforge`` logger gets a NullHandler when
first created here, so a library never prints through logging's last resort.
"""

from __future__ import annotations

import sys

_DEBUG = 10  # logging.DEBUG

TYPE_CHECKING = False
if TYPE_CHECKING:
    import logging
    from typing import Any

_loggers: dict[str, logging.Logger] = {}


def get_logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)`` (imports logging), with cuforge's NullHandler in place."""
    found = _loggers.get(name)
    if found is None:
        import logging

        _null_handler(logging)
        found = _loggers[name] = logging.getLogger(name)
    return found


def _null_handler(logging: Any) -> None:
    root = logging.getLogger("cuforge")
    if not any(isinstance(h, logging.NullHandler) for h in root.handlers):
        root.addHandler(logging.NullHandler())


def null_handler_if_loaded() -> None:
    """Give the ``cuforge`` logger its NullHandler now if ``logging`` is already
    imported (free otherwise; ``get_logger`` does it when first used)."""
    logging = sys.modules.get("logging")
    if logging is not None:
        _null_handler(logging)


def debug_enabled(name: str) -> bool:
    """Whether ``name`` would emit DEBUG records; False while logging is not imported."""
    if "logging" not in sys.modules:
        return False
    return get_logger(name).isEnabledFor(_DEBUG)


__all__ = ["debug_enabled", "get_logger", "null_handler_if_loaded"]
