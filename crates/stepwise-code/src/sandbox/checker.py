# The checker's side of the sandbox (stepwise-code), after codec.py: the problem's tests run here,
# in a process of their own that the program under test cannot reach. The program's functions
# are proxies: a call sends its arguments to the candidate's process (through stepwise) and gets
# back plain data (codec.py), so whatever the program does to its own builtins, frames, modules
# or output, the assertions here compare values with the tests' own code. Long-lived: one job
# after another, each in a fresh namespace.
#
# Protocol, one JSON line a message; fd 3 from stepwise, fd 4 to it:
#   in:  {"header", "setup", "check", "entry_point", "asserts", "functions", "max_tests"}
#   out: {"call": ...} (a proxy's call, relayed to the candidate), then in: its reply, or
#        {"died": why} when the program ended during the call
#   out: {"result": {"status", "tests", "tests_dropped", "message", "refused"}}
import ast
import builtins
import json
import sys

channel = Lines(3)


class Refused(Exception):
    """The kernel refused the program something (it raised PermissionError)."""


class Ended(Exception):
    """The program's process ended during a call."""


def rebuilt(kind, message):
    """The exception a call raised, as the tests may catch it: a built-in exception type of the
    same name (its message kept), else a RuntimeError naming the type."""
    if kind == "PermissionError":
        return Refused("%s: %s" % (kind, message))
    cls = getattr(builtins, kind, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(message)
        except Exception:
            pass
    return RuntimeError("%s: %s" % (kind, message))


def updated(arg, after):
    """A mutable argument changed by the call, changed here in place too."""
    t = type(arg)
    if after is None or type(after) is not t or after == arg:
        return
    if t is list or t is bytearray:
        arg[:] = after
    else:
        arg.clear()
        arg.update(after)


def proxy(name):
    def call(*args, **kwargs):
        send(4, '{"call":%s,"args":[%s],"kwargs":[%s]}' % (
            _esc(name), ",".join([encode(a) for a in args]),
            ",".join(["[%s,%s]" % (_esc(k), encode(v)) for k, v in kwargs.items()])))
        line = channel.readline()
        if line is None:
            sys.exit(0)
        reply = decode(line)
        if "died" in reply:
            raise Ended(reply["died"])
        if "raised" in reply:
            kind, message = reply["raised"]
            raise rebuilt(kind, message)
        for a, after in zip(args, reply.get("after") or ()):
            updated(a, after)
        return reply["value"]
    call.__name__ = call.__qualname__ = name
    return call


class Asserts(ast.NodeTransformer):
    """`assert e, m` becomes `__stepwise_assert__(line, lambda: e)`: every assertion is recorded
    and the tests go on after one fails."""

    def visit_Assert(self, node):
        call = ast.Call(
            func=ast.Name(id="__stepwise_assert__", ctx=ast.Load()),
            args=[ast.Constant(node.lineno),
                  ast.Lambda(args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[],
                                                kw_defaults=[], defaults=[]), body=node.test)],
            keywords=[])
        return ast.copy_location(ast.Expr(value=call), node)


_compiled = {}


def compiled(source, name, asserts=True):
    """`source` compiled (its assertions recorded one by one when `asserts`), kept for the next
    job of the same problem."""
    key = (source, name, asserts)
    code = _compiled.get(key)
    if code is None:
        if asserts:
            tree = Asserts().visit(ast.parse(source, name))
            code = compile(ast.fix_missing_locations(tree), name, "exec")
        else:
            code = compile(source, name, "exec")
        if len(_compiled) >= 4096:
            _compiled.clear()
        _compiled[key] = code
    return code


def run_tests(job, result):
    max_tests = job["max_tests"]

    def record(line, check):
        try:
            ok = bool(check())
            error = None if ok else "assertion failed"
        except (Refused, Ended, MemoryError, RecursionError):
            raise
        except BaseException as e:
            ok, error = False, ("%s: %s" % (type(e).__name__, e))[:300]
        if len(result["tests"]) < max_tests:
            result["tests"].append({"line": line, "passed": ok, "error": error})
        else:
            result["tests_dropped"] += 1
        if not ok and result["status"] == "passed":
            result["status"] = "failed"

    namespace = {"__name__": "__checker__", "__builtins__": builtins, "__stepwise_assert__": record}
    if job.get("header"):
        exec(compiled(job["header"], "<header>", False), namespace)
    trusted = set(namespace)
    entry = job.get("entry_point") or ""
    for name in job["functions"]:
        # The program's functions, except names the problem's own code or Python's builtins
        # define: a program cannot replace `abs` or a helper of the prompt that the tests use.
        if type(name) is str and name.isidentifier() and not name.startswith("__") and (
                name == entry or (name not in trusted and not hasattr(builtins, name))):
            namespace[name] = proxy(name)
    if job.get("setup"):
        exec(compiled(job["setup"], "<setup>", False), namespace)
    if job.get("check"):
        exec(compiled(job["check"], "<tests>"), namespace)
        check = namespace.get("check")
        if check is None:
            raise NameError("the tests define no `check(candidate)`")
        if entry not in job["functions"]:
            raise NameError("the program defines no `%s`" % entry)
        check(namespace[entry])
    for i, line in enumerate(job.get("asserts") or []):
        exec(compiled(line, "<test %d>" % i), namespace)


def judge(job):
    result = {"status": "passed", "tests": [], "tests_dropped": 0, "message": None, "refused": None}
    try:
        run_tests(job, result)
    except Refused as e:
        result["status"], result["message"], result["refused"] = "refused", str(e), str(e)
    except Ended as e:
        result["status"], result["message"] = "error", "the program ended during a call: %s" % e
    except MemoryError:
        result["status"], result["message"] = "memory", "the program ran out of its memory limit"
    except RecursionError as e:
        result["status"], result["message"] = "error", "RecursionError: %s" % e
    except BaseException as e:
        result["status"], result["message"] = "error", ("%s: %s" % (type(e).__name__, e))[:500]
    return result


def main():
    while True:
        line = channel.readline()
        if line is None:
            return
        send(4, json.dumps({"result": judge(json.loads(line))}, ensure_ascii=True))


main()
