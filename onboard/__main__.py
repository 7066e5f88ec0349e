"""`python -m onboard ...` is the `onboard` command."""

from onboard.cli import main

main()
