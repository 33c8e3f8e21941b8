"""Reading the dashboard's server-sent events back."""

from __future__ import annotations

import json


def events(body: str) -> list[tuple[str, dict]]:
    """(event, data) of each server-sent event with data."""
    found = []
    for block in body.split("\n\n"):
        kind, data = "message", []
        for line in block.split("\n"):
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        if data:
            found.append((kind, json.loads("\n".join(data))))
    return found
