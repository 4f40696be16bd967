"""`python -m tensorplan ...` runs the CLI (where the `tensorplan` script is not on PATH)."""
from .cli import main

main()
