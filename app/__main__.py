"""`python -m cacheroute` runs the CLI."""

from cacheroute.cli.main import main

main()
