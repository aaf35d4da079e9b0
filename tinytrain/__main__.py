"""``python -m tinytrain`` is the ``tinytrain`` command."""
import sys

from tinytrain.cli import main

sys.exit(main())
