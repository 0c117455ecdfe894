"""`python -m stator` is the `stator` command."""

import sys

from stator.cli.main import main

sys.exit(main())
