#!/usr/bin/env python3
"""Entry point for running a dataservice server from a checkout: same as `data-server`."""

import sys

from dataservice.cli import main

if __name__ == "__main__":
    sys.exit(main())
