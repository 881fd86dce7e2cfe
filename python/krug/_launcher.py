"""The ``krugrun`` command of a pip-installed krug: runs the krugrun binary installed inside the
package (krug/bin/krugrun), which finds libkrug through its run path wherever pip put the
package."""

import os
import sys

from krug import _build_info


def krugrun_path():
    """The krugrun binary of this installation (or build tree)."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.normpath(os.path.join(here, _build_info.krugrun))


def main():
    path = krugrun_path()
    try:
        os.execv(path, [path] + sys.argv[1:])
    except OSError as e:
        sys.exit("krugrun: cannot run %s: %s (reinstall krug: pip install --force-reinstall "
                 "krug)" % (path, e.strerror))


if __name__ == "__main__":
    main()
