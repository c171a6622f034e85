"""Profile runs only (``_coldprofile``): every Python process of the run is profiled.

On ``PYTHONPATH`` only when a benchmark runs with ``--profile``; then chains to the
``sitecustomize`` this one shadows, if there is one.
"""

import importlib.machinery
import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_here))
try:
    import _coldprofile

    _coldprofile.install()
finally:
    sys.path.remove(os.path.dirname(_here))
_spec = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _here]
)
if _spec is not None and _spec.loader is not None:
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
