"""A module that takes ``SLOW_IMPORT_SECONDS`` (default 4) to import: a fork server's slow preload
(torch takes seconds on a cold disk), for the liveness tests."""
import os
import time

time.sleep(float(os.environ.get("SLOW_IMPORT_SECONDS", "4")))
