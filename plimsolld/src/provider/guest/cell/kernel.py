# plimsoll's Python cell kernel (providers.md §9.6), run by the launcher as
#
#   python3 -I -c <this file> <kernel dir>
#
# It listens on <dir>/ctl.sock, then writes its PID to <dir>/ready. Each connection carries one
# cell, {"nonce","code"} and a newline; connections are taken one at a time in arrival order.
# Around a cell it writes \0plimsoll-cell-start-<nonce>\0 and \0plimsoll-cell-end-<nonce>\0 to
# fd 1 and fd 2 (the relay forwards only what lies between them), then answers
# {"status":"ok"|"error"} and closes. Every cell runs in one namespace named __main__; a last
# expression is compiled apart, its repr printed and kept in `_`; top-level await runs on one
# persistent event loop; any BaseException, SystemExit included, ends only the cell.
#
# asyncio (with what it imports, about 5 MiB of an idle kernel's 10) is imported only when
# something needs it: a cell's top-level await, or the first import of asyncio by a cell, which
# a one-shot import hook completes by making and setting the kernel's loop, so that a cell's
# asyncio.get_event_loop() returns it exactly as if asyncio had been imported at start.


def _plimsoll_kernel():
    import _thread
    import ast
    import builtins
    import importlib.machinery
    import json
    import linecache
    import os
    import re
    import socket
    import sys
    import traceback
    import types

    kernel_dir = sys.argv[1]
    # The launcher preloads the runner guard (this process is now non-dumpable); the processes
    # cells start do not inherit it.
    if os.environ.get("LD_PRELOAD") == "/usr/local/lib/plimsoll-runner-guard.so":
        del os.environ["LD_PRELOAD"]
    sys.argv = [""]
    # Isolated mode leaves the working directory off the path; cells may import from /work.
    sys.path.insert(0, "")

    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    namespace = main.__dict__
    loop = None
    main_thread = _thread.get_ident()
    # inspect.CO_COROUTINE, without importing inspect.
    co_coroutine = 0x0080
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    nonce_shape = re.compile(r"[0-9a-f]{32}\Z")

    def flush():
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                stream.flush()
            except BaseException:
                pass

    def marker(text):
        flush()
        data = text.encode()
        for fd in (1, 2):
            try:
                os.write(fd, data)
            except OSError:
                pass  # the code closed it; the relay stops waiting after 2 s

    def set_loop(asyncio):
        nonlocal loop
        if loop is None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)

    class SetLoopOnImport:
        """Sets the kernel's loop as soon as asyncio has been imported, then leaves."""

        def find_spec(self, name, path=None, target=None):
            if name != "asyncio":
                return None
            try:
                sys.meta_path.remove(self)
            except ValueError:
                pass
            try:
                spec = importlib.machinery.PathFinder.find_spec(name, path)
            except BaseException:
                return None
            if spec is None or spec.loader is None:
                return None
            spec.loader = LoaderSettingLoop(spec.loader)
            return spec

    class LoaderSettingLoop:
        """asyncio's own loader, which then sets the loop and puts itself back."""

        def __init__(self, real):
            self.real = real

        def __getattr__(self, name):
            return getattr(self.real, name)

        def create_module(self, spec):
            return self.real.create_module(spec)

        def exec_module(self, module):
            try:
                module.__spec__.loader = self.real
                module.__loader__ = self.real
            except BaseException:
                pass
            self.real.exec_module(module)
            try:
                # asyncio.set_event_loop is per thread: the kernel's loop is the main thread's.
                if _thread.get_ident() == main_thread:
                    set_loop(module)
            except BaseException:
                pass  # set before the next cell, or by the first top-level await

    sys.meta_path.insert(0, SetLoopOnImport())

    def evaluate(code, mode, filename):
        compiled = compile(code, filename, mode, flags=flags, dont_inherit=True)
        result = eval(compiled, namespace)
        if compiled.co_flags & co_coroutine:
            import asyncio

            set_loop(asyncio)
            result = loop.run_until_complete(result)
        return result

    def run_cell(number, source):
        filename = "<cell %d>" % number
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        tree = ast.parse(source, filename, "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        evaluate(ast.Module(tree.body, type_ignores=[]), "exec", filename)
        if last is not None:
            value = evaluate(last, "eval", filename)
            if value is not None:
                namespace["_"] = value
                print(repr(value))

    def print_error(error, number):
        filename = "<cell %d>" % number
        tb = error.__traceback__
        # Only the cell's frames (and what it called): the kernel's own are noise.
        while tb is not None and tb.tb_frame.f_code.co_filename != filename:
            tb = tb.tb_next
        try:
            text = "".join(traceback.format_exception(type(error), error, tb))
            sys.stderr.write(text)
        except BaseException:
            try:
                os.write(2, b"the cell raised an exception that could not be printed\n")
            except OSError:
                pass

    def read_cell(conn):
        data = b""
        while b"\n" not in data:
            piece = conn.recv(65536)
            if not piece:
                return None
            data += piece
        cell = json.loads(data.split(b"\n", 1)[0])
        nonce, code = cell.get("nonce"), cell.get("code")
        if not isinstance(nonce, str) or not nonce_shape.match(nonce) or not isinstance(code, str):
            return None
        return nonce, code

    def plug_standard_fds():
        # A cell may close fd 0, 1 or 2; the next socket would then take that number and the
        # markers would land in it. Reopen what is missing (the FIFOs, so output still flows).
        targets = ((0, os.devnull), (1, os.path.join(kernel_dir, "out")), (2, os.path.join(kernel_dir, "err")))
        for fd, path in targets:
            try:
                os.fstat(fd)
                continue
            except OSError:
                pass
            try:
                opened = os.open(path, os.O_RDWR)
            except OSError:
                continue
            if opened != fd:
                os.dup2(opened, fd)
                os.close(opened)

    ctl = os.path.join(kernel_dir, "ctl.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(ctl)
    server.listen(64)
    ready = os.path.join(kernel_dir, "ready")
    with open(ready + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(ready + ".tmp", ready)

    number = 0
    while True:
        plug_standard_fds()
        try:
            conn, _ = server.accept()
        except InterruptedError:
            continue
        except BaseException:
            continue
        try:
            cell = read_cell(conn)
        except BaseException:
            cell = None
        if cell is None:
            conn.close()
            continue
        nonce, code = cell
        number += 1
        if loop is None and "asyncio" in sys.modules:
            try:
                set_loop(sys.modules["asyncio"])
            except BaseException:
                pass
        marker("\0plimsoll-cell-start-%s\0" % nonce)
        status = "ok"
        try:
            run_cell(number, code)
        except BaseException as error:
            status = "error"
            print_error(error, number)
        marker("\0plimsoll-cell-end-%s\0" % nonce)
        try:
            conn.sendall(json.dumps({"status": status}).encode() + b"\n")
        except BaseException:
            pass
        try:
            conn.close()
        except BaseException:
            pass


_plimsoll_kernel()
