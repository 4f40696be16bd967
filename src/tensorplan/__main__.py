"""`python -m tensorplan ...` runs the CLI (where the `tensorplan` script is not on PATH)."""
from tensorplan.cli import main

if __name__ == "__main__":      # spawned worker processes import this module again: no second CLI run
    main()
