import sys

from fedfilter.cli import main

sys.exit(main())
