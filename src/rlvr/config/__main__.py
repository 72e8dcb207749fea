"""`python -m rlvr.config --markdown > docs/config.md`."""

import sys

from rlvr.config.reference import main

sys.exit(main(sys.argv[1:]))
