# Fixtures live in zero_testlib (a unique module name: tests/python may grow
# its own conftest.py, and pytest runs both directories in one session).
from zero_testlib import world, zero_mod  # noqa: F401
