"""Warnings that point at the user's line: ``cuforge._stack.outside_level``, named
here for the compile layer's callers."""

from __future__ import annotations

from cuforge._stack import outside_level

__all__ = ["outside_level"]
