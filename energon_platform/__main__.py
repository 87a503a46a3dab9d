import sys

from energon_platform.cli import main

sys.exit(main())
