# TESTS ONLY. On PYTHONPATH for the torch 2.x (chroot) runs alone, by tests/torch2/python3;
# never part of what ddprun gives its users.
# Like ddprun's own worker bootstrap (src/launcher/python/sitecustomize.py), which comes after
# it on PYTHONPATH, it then imports the next sitecustomize on the path (ddprun's, Debian's).
#
# Why: Debian's python3-torch 2.6 is built without libuv, yet TCPStore's use_libuv defaults
# to True, and torch's own callers never pass it (init_process_group's env:// path under
# TORCHELASTIC_USE_AGENT_STORE, torchrun's c10d and static rendezvous). So every such store
# fails with "RuntimeError: use_libuv was requested but PyTorch was build without libuv
# support" (USE_LIBUV=0 does not help). A pip wheel of torch has libuv and needs none of this.
# ddprun's failure summary names the cause when a worker dies of it (src/launcher/report.cpp).
#
# What: when torch.distributed is imported, its TCPStore is replaced, wherever the name is
# bound, by a subclass whose use_libuv defaults to False. Lazy, so that a Python worker that
# never imports torch.distributed pays nothing. DDP_TORCH2_SHIM=0 leaves it out (the tests of
# that error message).
import importlib.abc
import sys


def _patch(dist):
    orig = dist.TCPStore

    class TCPStore(orig):
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("use_libuv", False)
            super().__init__(*args, **kwargs)

    TCPStore.__module__, TCPStore.__qualname__ = orig.__module__, orig.__qualname__
    for mod in list(sys.modules.values()):
        if getattr(mod, "TCPStore", None) is orig and mod.__name__ != "torch._C._distributed_c10d":
            setattr(mod, "TCPStore", TCPStore)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "torch.distributed":
            return None
        for finder in sys.meta_path:  # the finders that would have found it
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


if "torch.distributed" in sys.modules:
    _patch(sys.modules["torch.distributed"])
else:
    sys.meta_path.insert(0, _PatchOnImport())


def _chain(this):
    import importlib
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    del sys.modules["sitecustomize"]
    try:
        importlib.import_module("sitecustomize")
    except ImportError as e:
        if e.name != "sitecustomize":
            raise
        sys.modules["sitecustomize"] = this


_chain(sys.modules[__name__])
