import sys

from specagent.cli import main

sys.exit(main())
