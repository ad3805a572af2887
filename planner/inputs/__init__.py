"""Untrusted input at the entry points: size and planning limits, checked loaders."""
