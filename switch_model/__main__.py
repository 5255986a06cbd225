import sys

from switch_model.cli import main

sys.exit(main())
