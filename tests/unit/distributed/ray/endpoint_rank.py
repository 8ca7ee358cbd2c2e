"""A stand-in training rank for test_ray_endpoint.py, in a module of its own: the test checks which
processes import it."""

from __future__ import annotations


class Rank:
    def receive_weights(self, path: str, payload: dict) -> dict:
        return {"success": True, "received": True, "path": path, "payload": payload}
