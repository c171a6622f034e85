"""Run the ``cuforge`` command line as if device 0 were a GPU of another arch.

This machine (and CI) has no GPU, and the GPU machine has one kind of GPU, so a
test cannot swap device 0's architecture for real (``CUDA_VISIBLE_DEVICES`` onto
another model, or a node with other GPUs sharing ``$HOME``). This runner stands in
for that one driver query and nothing else: ``python tests/_fake_device.py ARGS``
runs ``cuforge ARGS`` with ``current_device_arch()`` answering
``$TEST_DEVICE0_ARCH`` (unset or empty: no device; deliberately not a
``CUFORGE_*`` name, which the fast hit path reads into its request digest). Everything else -- the
fast hit path, argument parsing, NVRTC, the cache -- is the real code. The patch
lands before the compile layer imports the function by name.
"""

from __future__ import annotations

import os
import sys


def _fake_arch() -> str | None:
    return os.environ.get("TEST_DEVICE0_ARCH") or None


def main() -> int:
    from cuforge.compile import _versions

    _versions.current_device_arch = _fake_arch
    from cuforge.cli import main as cli_main

    return cli_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
