import sys

from configgen.cli import main

sys.exit(main())
