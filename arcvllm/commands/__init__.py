"""The `arcvllm` commands, one module each: runs wherever the command runs (the operator's
host, the build host, the image), and holds only argparse's set-up and a handler that calls
the domain modules' functions and prints what they return.

Each module's `register(subparsers)` adds its command (and that command's own
sub-commands) and sets `func`; arcvllm.cli lists them, grouped. Options the commands share
are arcvllm.options'.
"""
