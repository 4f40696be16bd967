"""End-to-end workflows that wire the layers together (the `tensorplan demo` job and friends)."""
