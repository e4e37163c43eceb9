"""harness.cli"""

import os

# numpy asks the kernel for transparent huge pages on every large array (madvise); where THP
# defrag is "madvise" (the Debian/Ubuntu default) such an allocation may compact memory
# synchronously: ~0.2 s of system time in a 100k-request simulation on this project's CI
# boxes, 4% of the whole process. The CLI opts out (NUMPY_MADVISE_HUGEPAGE, read once when
# numpy is imported) unless the user chose; the variable is not left for the engines and
# workers it launches.
if "NUMPY_MADVISE_HUGEPAGE" not in os.environ:
    os.environ["NUMPY_MADVISE_HUGEPAGE"] = "0"
    try:
        import numpy  # noqa: F401
    finally:
        del os.environ["NUMPY_MADVISE_HUGEPAGE"]
