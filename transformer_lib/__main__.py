"""python -m transformer_lib: see transformer_lib/cli.py."""

import sys

from transformer_lib.cli import main

sys.exit(main())
