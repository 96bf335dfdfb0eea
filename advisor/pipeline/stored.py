"""Measurements kept in the user's cache as JSON documents: a format name, a schema number, the body and
the body's SHA-256, so that an edited, truncated or older file reads as absent and is measured again."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from advisor.atomic import write_atomically


def checksum(body: Any) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def read_document(path: Path, format_name: str, schema: int) -> dict[str, Any] | None:
    """The body stored at `path`, or None (absent, unreadable, another format or schema, edited)."""
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(document, dict):
        return None
    body = document.get("body")
    if document.get("format") != format_name or document.get("schema") != schema \
            or not isinstance(body, dict) or document.get("checksum") != checksum(body):
        return None
    return body


def write_document(path: Path, format_name: str, schema: int, body: dict[str, Any]) -> None:
    """Store `body` at `path` atomically (its folder made if needed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps({"format": format_name, "schema": schema, "body": body,
                                       "checksum": checksum(body)}, indent=1))


def read_recent(path: Path, format_name: str, schema: int, max_age_s: float) -> dict[str, Any] | None:
    """The body stored at `path` (see read_document) if its `measured_at` (time.time() when written) is at
    most `max_age_s` ago, else None."""
    body = read_document(path, format_name, schema)
    if body is None:
        return None
    try:
        age = time.time() - float(body["measured_at"])
    except (ValueError, KeyError, TypeError):
        return None
    return body if 0 <= age <= max_age_s else None
