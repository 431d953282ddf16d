"""The ``userturn`` command line: parses arguments and calls library functions."""
