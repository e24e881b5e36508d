import sys

from hora.cli import main

sys.exit(main())
