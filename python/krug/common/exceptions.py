"""Exceptions shared by krug's frameworks, named as Horovod names them so that
``except HorovodInternalError`` in existing scripts (and elastic training) keeps working."""


class HorovodInternalError(RuntimeError):
    """An operation failed inside krug: mismatched tensors across ranks, a reused name,
    a dead peer, a timeout, or krug was shut down. The message names the tensor, the ranks
    and the cause. In elastic mode this triggers a restore of the last committed state."""


class HostsUpdatedInterrupt(RuntimeError):
    """The set of hosts changed (elastic mode): training should stop at a consistent
    point and re-initialize. ``skip_sync`` says whether the state may be used without
    synchronizing it again: hosts were only removed, so every remaining rank already holds
    the same committed state."""

    def __init__(self, skip_sync=False):
        super().__init__("hosts updated")
        self.skip_sync = skip_sync


class WorkerRemoved(RuntimeError):
    """The elastic driver removed this worker from the job: its host left the discovery
    output, or it was evicted as a straggler. Raised by ``init()`` in elastic mode, where a
    worker waits for its place in the next round; ``elastic.run`` then exits the process with
    status 0 (the job goes on without it, so this is not a failure)."""


def get_version_mismatch_message(name, version, installed_version):
    """Says that framework ``name`` is here at ``version`` while krug's binding was built
    against ``installed_version`` (None: built without it), and how to fix that."""
    built = ("was built without it" if installed_version is None
             else "was built against {} {}".format(name, installed_version))
    return ("{} {} is installed, but krug {}: its binding may fail at run time. Rebuild krug "
            "in this environment (python -m krug.info shows what it was built with)."
            .format(name, version, built))


class HorovodVersionMismatchError(ImportError):
    """A framework's version differs from the one krug's binding was built against (Horovod's
    name; raised by ``krug.common.util.check_installed_version``)."""

    def __init__(self, name, version, installed_version):
        super().__init__(get_version_mismatch_message(name, version, installed_version))
        self.name = name
        self.version = version
        self.installed_version = installed_version


__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt", "WorkerRemoved",
           "HorovodVersionMismatchError", "get_version_mismatch_message"]
