"""``cuforge run`` puts this directory first on its child's ``PYTHONPATH``: every
Python process of the job runs this at start-up and wires its JITs to the run's
cache (``cuforge.integrations._bootstrap``). Then the environment's own
``sitecustomize`` (if any) runs, as it would have without cuforge.

Nothing here may fail the job's Python: a cuforge that cannot be imported (another
interpreter than the one cuforge is installed in) is one line on stderr.
"""

import os
import sys


def _cuforge() -> None:
    if not os.environ.get("CUFORGE_RUN"):
        return
    try:
        from cuforge.integrations import _bootstrap
    except Exception as exc:  # another Python, or a broken install: say so, run on
        if not os.environ.get("CUFORGE_RUN_QUIET"):
            sys.stderr.write(
                f"cuforge run: this Python ({sys.executable}) cannot import cuforge "
                f"({type(exc).__name__}: {exc}); its JITs are not wired to the cache\n"
            )
        return
    _bootstrap.start()


def _chain() -> None:
    """Run the next ``sitecustomize`` on ``sys.path`` (the one this file shadows)."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_cuforge()
_chain()
