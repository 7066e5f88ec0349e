"""`python -m onboard ...` is the `onboard` command."""

from onboard.cli.app import main

main()
