"""``python -m argus.cli``."""

from . import main

main()
