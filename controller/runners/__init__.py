"""Runners start, inspect and release sandboxes. ``base.Runner`` is the protocol."""
