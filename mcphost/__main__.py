"""`python -m mcphost` is the `mcphost` command."""

import sys

from mcphost.cli import main

sys.exit(main())
