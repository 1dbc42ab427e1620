"""``python -m jobkeeper``: the CLI."""

from jobkeeper.cli.main import main

if __name__ == "__main__":
    main()
