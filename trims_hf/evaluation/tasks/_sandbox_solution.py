"""The sandbox's solution process (see :mod:`trims_hf.evaluation.tasks.sandbox`).

Not imported: run as ``python -I -B -c`` after the text of ``_sandbox_codec.py`` (which defines ``encode``,
``decode`` and ``setup``); argv: limits (JSON), request fd, reply fd, isolation ("bubblewrap" or "process");
the solution's source on stdin.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the codec's names, prepended at run time
    from ._sandbox_codec import builtins, decode, encode, json, os, setup, sys  # noqa: TC004

def _make_guard(root, namespaced):
    # Everything the hook consults is bound in this closure: the untrusted code could rebind
    # module globals (`import __main__`), but not these.
    blocked = frozenset({
        "os.fork", "os.forkpty", "os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.startfile",
        "subprocess.Popen", "os.kill", "os.killpg", "signal.pthread_kill", "os.setuid", "os.chroot",
        "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.call_function", "socket.connect",
        "socket.bind", "socket.sendto", "socket.sendmsg",
    })
    # Allowed only on paths inside the sandbox (tempfile, for one, creates and removes files there).
    path_events = frozenset({
        "os.remove", "os.rmdir", "os.rename", "os.truncate", "os.chmod", "os.chown", "os.chflags",
        "os.link", "os.symlink", "shutil.rmtree", "shutil.chown",
    })
    # Under bubblewrap the namespaces are the boundary, so these modules import (numpy, scipy, pandas, sympy and
    # asyncio need them, and the reference graders allow them): the events above refuse their plain uses, and what
    # gets below them (_posixsubprocess.fork_exec is unaudited) stays inside the namespaces; ctypes' import itself
    # opens the running program (dlopen of None). Without namespaces this hook is the only layer, so they stay out.
    blocked_imports = frozenset() if namespaced else frozenset(
        {"_posixsubprocess", "_ctypes", "ctypes", "subprocess", "multiprocessing"})
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    realpath, fspath, path_like, prefix = os.path.realpath, os.fspath, os.PathLike, root + os.sep

    def inside(path):
        resolved = realpath(fspath(path))
        if isinstance(resolved, bytes):
            resolved = resolved.decode("utf-8", "surrogateescape")
        return resolved == root or resolved.startswith(prefix) or resolved == "/dev/null"

    def guard(event, args):
        if event == "ctypes.dlopen" and namespaced and args[0] is None:
            return
        if event in blocked:
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "import" and args[0] in blocked_imports:
            raise PermissionError(f"sandbox: import of {args[0]} is not allowed")
        if event in path_events:
            paths = [a for a in args if isinstance(a, (str, bytes, path_like))]
            if isinstance(args[0], int) or not all(map(inside, paths)):
                raise PermissionError(f"sandbox: {event} outside the sandbox is not allowed: {args!r}")
        if event == "open" and isinstance(args[0], (str, bytes)) and args[2] & write_flags and not inside(args[0]):
            raise PermissionError(f"sandbox: writing {args[0]!r} outside the sandbox is not allowed")

    return guard


def _main():
    request_fd, reply_fd = setup()
    isolation = sys.argv[4]
    requests, replies = os.fdopen(request_fd, "rb"), os.fdopen(reply_fd, "wb")
    source = sys.stdin.read()
    sys.stdin.close()
    objects = []  # handle -> object, for everything that is not a plain value

    def handle(obj):
        if isinstance(obj, type(sys)) and obj.__name__ in sys.stdlib_module_names:
            return {"m": obj.__name__}
        objects.append(obj)
        return {"h": len(objects) - 1}

    def send(message):
        replies.write(json.dumps(message).encode() + b"\n")
        replies.flush()

    def failure(error):
        return {"raise": [type(error).__name__, str(error)]}

    # No __name__, as in the reference graders' exec(program, {}): it reads builtins' ("builtins"), so a
    # completion's `if __name__ == "__main__":` block does not run.
    namespace = {"__builtins__": builtins}
    try:
        code = compile(source, "solution.py", "exec")
        sys.addaudithook(_make_guard(os.getcwd(), isolation == "bubblewrap"))
        exec(code, namespace)  # noqa: S102 (running untrusted code is this process's job)
        send({"ready": {k: encode(v, handle) for k, v in namespace.items() if not k.startswith("__")}})
    except BaseException as error:
        send(failure(error))
        raise
    sys.stdout.flush()
    for line in requests:
        try:
            call = json.loads(line)
            if "iter" in call:  # the judge iterates over an object of ours, one item per request
                reply = {"ok": encode(iter(objects[call["iter"]]), handle)}
            elif "next" in call:
                reply = {"ok": encode(next(objects[call["next"]]), handle)}
            else:
                function = objects[call["call"]]
                args = decode(call["args"], objects.__getitem__)
                kwargs = decode(call["kwargs"], objects.__getitem__)
                reply = {"ok": encode(function(*args, **kwargs), handle)}
        except BaseException as error:  # noqa: BLE001 (any failure of the solution is the judge's to report)
            reply = failure(error)
        sys.stdout.flush()
        send(reply)


if __name__ == "__main__":
    _main()
