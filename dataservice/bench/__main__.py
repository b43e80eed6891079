"""`python -m dataservice.bench`: see dataservice/bench/workloads.py."""

import sys

from dataservice.bench.workloads import main

sys.exit(main())
