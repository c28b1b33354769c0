# The sandbox's harness (stepwise-code): reads one job as JSON on stdin, runs the program and its
# tests under resource limits with the dangerous parts of the standard library refused, and
# writes one result line after a marker that only the caller knows. Run as
# `python3 -I -S -B -c HARNESS` in a throw-away working directory with an empty environment.
import ast
import builtins
import io
import json
import os
import posix
import resource
import sys


def main():
    job = json.loads(sys.stdin.read())
    nonce = job["nonce"]
    write_out = sys.stdout.write
    flush_out = sys.stdout.flush
    exit_now = os._exit
    result = {"status": "passed", "tests": [], "tests_dropped": 0, "trace": [], "stdout": "",
              "message": None, "refused": None}

    def finish():
        try:
            text = json.dumps(result)
        except Exception as e:  # an unrepresentable value slipped in: say so
            text = json.dumps({"status": "error", "message": "result: %s" % e, "tests": [],
                               "tests_dropped": 0, "trace": [], "stdout": "", "refused": None})
        write_out("\n<<<stepwise-result %s>>>\n%s\n" % (nonce, text))
        flush_out()
        exit_now(0)

    # Limits: address space, file size, CPU seconds, no core files, no new processes.
    mem = job["memory_bytes"]
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_FSIZE, (job["max_file_bytes"], job["max_file_bytes"]))
    cpu = job["cpu_seconds"]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    try:
        resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    except (ValueError, OSError):
        pass
    home = os.path.realpath(os.getcwd())

    class Refused(PermissionError):
        pass

    def refuse(what):
        def refused(*args, **kwargs):
            if result["refused"] is None:
                result["refused"] = what
            raise Refused("refused by the sandbox: " + what)
        return refused

    os.environ.clear()
    # Processes, signals, the environment, and changes to files: refused. (Reading directories is
    # left alone: the import system lists them.)
    for name in ["fork", "forkpty", "vfork", "system", "popen", "execv", "execve", "execl", "execle",
                 "execlp", "execlpe", "execvp", "execvpe", "spawnv", "spawnve", "spawnl", "spawnle",
                 "spawnlp", "spawnlpe", "spawnvp", "spawnvpe", "posix_spawn", "posix_spawnp", "kill",
                 "killpg", "putenv", "unsetenv", "remove", "unlink", "rmdir", "removedirs", "rename",
                 "renames", "replace", "chmod", "fchmod", "lchmod", "chown", "fchown", "lchown",
                 "truncate", "ftruncate", "chdir", "fchdir", "chroot", "link", "symlink", "mkfifo",
                 "mknod", "setuid", "setgid", "seteuid", "setegid", "setreuid", "setregid", "nice",
                 "setpgid", "setsid", "_exit", "abort"]:
        for module in (os, posix):
            if hasattr(module, name):
                setattr(module, name, refuse("os." + name))

    real_open = io.open
    real_os_open = os.open

    def inside(path):
        try:
            p = os.path.realpath(os.fspath(path))
        except TypeError:
            return False
        return p == home or p.startswith(home + os.sep)

    def guarded_open(file, *args, **kwargs):
        if isinstance(file, int) or not inside(file):
            return refuse("open(%r)" % (file,))()
        return real_open(file, *args, **kwargs)

    def guarded_os_open(path, *args, **kwargs):
        if not inside(path):
            return refuse("os.open(%r)" % (path,))()
        return real_os_open(path, *args, **kwargs)

    builtins.open = guarded_open
    io.open = guarded_open
    os.open = guarded_os_open
    posix.open = guarded_os_open

    # Modules that reach the network, other processes or raw memory: importing one is refused.
    blocked = {"subprocess", "_posixsubprocess", "multiprocessing", "ctypes", "_ctypes", "socket",
               "_socket", "ssl", "_ssl", "select", "selectors", "pty", "resource", "signal",
               "urllib", "http", "ftplib", "smtplib", "telnetlib", "webbrowser", "asyncio",
               "concurrent", "mmap", "fcntl", "shutil", "tempfile", "importlib.util", "sysconfig"}

    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name in blocked or name.split(".")[0] in blocked:
                refuse("import " + name)()
            return None

    for name in list(sys.modules):
        if name in blocked or name.split(".")[0] in blocked:
            del sys.modules[name]
    sys.meta_path.insert(0, Blocker())

    # What the program prints is captured (bounded), never written where the result goes.
    class Captured(io.TextIOBase):
        def __init__(self, limit):
            self.parts, self.size, self.limit = [], 0, limit

        def write(self, s):
            if self.size < self.limit:
                self.parts.append(s[: self.limit - self.size])
            self.size += len(s)
            return len(s)

        def text(self):
            return "".join(self.parts)

    captured = Captured(job["max_output_chars"])
    sys.stdout = sys.stderr = sys.__stdout__ = sys.__stderr__ = captured

    max_tests = job["max_tests"]

    def record(line, check):
        try:
            ok = bool(check())
            error = None if ok else "assertion failed"
        except (Refused, MemoryError, RecursionError):
            raise
        except BaseException as e:
            ok, error = False, ("%s: %s" % (type(e).__name__, e))[:300]
        if len(result["tests"]) < max_tests:
            result["tests"].append({"line": line, "passed": ok, "error": error})
        else:
            result["tests_dropped"] += 1
        if not ok and result["status"] == "passed":
            result["status"] = "failed"

    class Asserts(ast.NodeTransformer):
        """`assert e, m` becomes `__stepwise_assert__(line, lambda: e)`: every assertion is
        recorded and the tests go on after one fails."""

        def visit_Assert(self, node):
            call = ast.Call(
                func=ast.Name(id="__stepwise_assert__", ctx=ast.Load()),
                args=[ast.Constant(node.lineno),
                      ast.Lambda(args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[],
                                                    kw_defaults=[], defaults=[]), body=node.test)],
                keywords=[])
            return ast.copy_location(ast.Expr(value=call), node)

    def compile_tests(source, name):
        tree = Asserts().visit(ast.parse(source, name))
        return compile(ast.fix_missing_locations(tree), name, "exec")

    # The execution trace of one function: its locals after each of its lines.
    trace_function = job.get("trace_function")
    max_events = job["max_trace_events"]
    calls = [0]

    def shown(v):
        try:
            r = repr(v)
        except BaseException:
            r = "<unrepresentable>"
        return r if len(r) <= 200 else r[:197] + "..."

    def snapshot(frame):
        return {k: shown(v) for k, v in frame.f_locals.items() if not k.startswith("__")}

    def tracer(frame, event, arg):
        if event != "call" or frame.f_code.co_filename != "<candidate>" or frame.f_code.co_name != trace_function:
            return None
        calls[0] += 1
        call = calls[0]
        last = [None]

        def local(frame, event, arg):
            if len(result["trace"]) >= max_events:
                return None
            if event == "line":
                if last[0] is not None:
                    result["trace"].append({"call": call, "line": last[0], "locals": snapshot(frame)})
                last[0] = frame.f_lineno
            elif event == "return":
                if last[0] is not None:
                    result["trace"].append({"call": call, "line": last[0], "locals": snapshot(frame),
                                            "returned": shown(arg)})
            elif event == "exception":
                result["trace"].append({"call": call, "line": frame.f_lineno, "locals": snapshot(frame),
                                        "raised": shown(arg[1])})
            return local
        return local

    namespace = {"__name__": "__candidate__", "__builtins__": builtins,
                 "__stepwise_assert__": record}
    try:
        program = compile(job["program"], "<candidate>", "exec")
    except SyntaxError as e:
        result["status"] = "error"
        result["message"] = "SyntaxError: %s (line %s)" % (e.msg, e.lineno)
        finish()
    except (ValueError, MemoryError) as e:
        result["status"] = "error"
        result["message"] = "%s: %s" % (type(e).__name__, e)
        finish()
    try:
        if trace_function:
            sys.settrace(tracer)
        exec(program, namespace)
        tests = job.get("tests") or {}
        if tests.get("setup"):
            exec(compile(tests["setup"], "<setup>", "exec"), namespace)
        if tests.get("check"):
            exec(compile_tests(tests["check"], "<tests>"), namespace)
            check = namespace.get("check")
            entry = namespace.get(tests["entry_point"])
            if check is None:
                raise NameError("the tests define no `check(candidate)`")
            if entry is None:
                raise NameError("the program defines no `%s`" % tests["entry_point"])
            check(entry)
        for i, line in enumerate(tests.get("asserts") or []):
            exec(compile_tests(line, "<test %d>" % i), namespace)
    except Refused as e:
        result["status"] = "refused"
        result["message"] = str(e)
    except MemoryError:
        result["status"] = "memory"
        result["message"] = "the program ran out of its memory limit"
    except RecursionError as e:
        result["status"] = "error"
        result["message"] = "RecursionError: %s" % e
    except BaseException as e:
        result["status"] = "error"
        result["message"] = ("%s: %s" % (type(e).__name__, e))[:500]
    finally:
        sys.settrace(None)
    result["stdout"] = captured.text()
    finish()


main()
