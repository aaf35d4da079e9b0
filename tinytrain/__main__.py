"""``python -m tinytrain`` is the ``tinytrain`` command."""
import sys

from .cli import main

sys.exit(main())
