"""Small math helpers."""


def sub(a, b):
    """Return a minus b."""
    return a - b
