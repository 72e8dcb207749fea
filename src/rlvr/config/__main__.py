"""`python -m rlvr.config --markdown > docs/config.md`;
`python -m rlvr.config --trl-page docs/migrating-from-trl.md` (its table, in place)."""

import sys

from rlvr.config.reference import main

sys.exit(main(sys.argv[1:]))
