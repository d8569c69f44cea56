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
# For the same reason an idle kernel holds only built-in modules and a few small ones: it uses
# _ast, _json and _socket (what ast, json and socket wrap; ast, with enum, is 1.9 MiB), checks
# the nonce without re, and imports traceback at the first error: about 2 MiB less per idle
# kernel, which a pool member may stay until it is ended.


def _plimsoll_kernel():
    import _ast
    import _json
    import _socket
    import _thread
    import builtins
    import importlib.machinery
    import linecache
    import os
    import sys
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
    flags = _ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    hex_digits = frozenset("0123456789abcdef")

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
        # What ast.parse does, without importing ast.
        tree = compile(source, filename, "exec", _ast.PyCF_ONLY_AST, dont_inherit=True)
        last = None
        if tree.body and isinstance(tree.body[-1], _ast.Expr):
            last = _ast.Expression(tree.body.pop().value)
        evaluate(_ast.Module(tree.body, type_ignores=[]), "exec", filename)
        if last is not None:
            value = evaluate(last, "eval", filename)
            if value is not None:
                namespace["_"] = value
                print(repr(value))

    def reject_constant(name):
        raise ValueError("%s is not JSON" % name)

    # The request line is decoded by json's own C scanner: importing json (with re) would cost
    # an idle kernel about 1 MiB and the first cell some 15 ms.
    scan_json = _json.make_scanner(
        types.SimpleNamespace(
            strict=True,
            object_hook=None,
            object_pairs_hook=None,
            parse_float=float,
            parse_int=int,
            parse_constant=reject_constant,
        )
    )
    tracebacks = []

    def format_exception(error, tb):
        # traceback is imported at the first error, with the working directory off the path so
        # that a file of that name there does not stand in for it.
        if not tracebacks:
            try:
                here = os.getcwd()
            except OSError:
                here = ""
            saved = list(sys.path)
            sys.path[:] = [entry for entry in saved if entry not in ("", here)]
            try:
                import traceback
            finally:
                sys.path[:] = saved
            tracebacks.append(traceback)
        return "".join(tracebacks[0].format_exception(type(error), error, tb))

    def print_error(error, number):
        filename = "<cell %d>" % number
        tb = error.__traceback__
        # Only the cell's frames (and what it called): the kernel's own are noise.
        while tb is not None and tb.tb_frame.f_code.co_filename != filename:
            tb = tb.tb_next
        try:
            text = format_exception(error, tb)
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
        line = data.split(b"\n", 1)[0].decode()
        start = len(line) - len(line.lstrip(" \t\r"))
        cell, end = scan_json(line, start)
        if line[end:].strip(" \t\r"):
            return None
        if not isinstance(cell, dict):
            return None
        nonce, code = cell.get("nonce"), cell.get("code")
        if not isinstance(nonce, str) or len(nonce) != 32 or not hex_digits.issuperset(nonce):
            return None
        if not isinstance(code, str):
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
    server = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
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
            # _socket's accept gives a descriptor (opened close-on-exec, blocking).
            fd, _ = server._accept()
            conn = _socket.socket(fileno=fd)
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
            conn.sendall(('{"status": "%s"}\n' % status).encode())
        except BaseException:
            pass
        try:
            conn.close()
        except BaseException:
            pass


_plimsoll_kernel()
