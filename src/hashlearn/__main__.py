"""``python -m hashlearn``: the same as the ``hashlearn`` command."""

from hashlearn.cli import main

if __name__ == "__main__":
    main(prog_name="hashlearn")
