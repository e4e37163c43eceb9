"""Placeholder: filled in by its issue (see harness/policies/__init__.py)."""
