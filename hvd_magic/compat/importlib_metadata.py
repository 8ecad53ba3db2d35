"""`importlib.metadata`'s private ``_path``: the folder a distribution found on the path reads its
metadata from (its ``.dist-info``). The standard library has no public name for it; where a
Python has none, the shipping of packages (`hvd_magic.launch.shipping`) does without, said once.
"""

import importlib.metadata
import platform

from . import unavailable


def metadata_folder(dist):
    """The ``.dist-info`` (or ``.egg-info``) folder of `dist`, or None (a distribution not
    found on the path, or a Python that does not say)."""
    found = getattr(dist, "_path", None)
    if found is None and isinstance(dist, importlib.metadata.PathDistribution):
        unavailable("importlib.metadata", "PathDistribution._path",
                    "hvd_magic's own METADATA is not shipped to the executors, and two copies of "
                    "a package on the path are packed as one", version=f"(Python "
                    f"{platform.python_version()})")
    return found
