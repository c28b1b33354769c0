# The candidate's side of the sandbox (stepwise-code), after codec.py: the untrusted program runs
# here, inside the kernel's walls, and answers calls. Nothing here decides a verdict: the tests
# run in another process (checker.py) and see only the plain data this side sends back, so a
# program that rewrites builtins, frames, modules or this file changes only its own answers.
#
# Protocol, one JSON line a message; fd 3 from stepwise, fd 4 to it, fds 1 and 2 the program's
# output (kept by stepwise, bounded):
#   in:  {"program", "trace_function", "max_trace_events"}
#   out: {"ready": [top-level callables]}, or {"ended": {...}, "trace": [...]} when it did not run
#   in:  {"call": name, "args": [...], "kwargs": [[k, v], ...]}
#   out: {"value": v, "after": [mutable arguments after the call, or null]} or {"raised": [type, message]}
#   in:  {"end": true}       out: {"ended": {"status": "ok"}, "trace": [...]}
# or, for a whole script:
#   in:  {"program", "script": true, "files", "fetch_files"}
#   out: {"ended": {"status": "ok", "code": exit status, "files": {name: base64}}}
import sys

requests = Lines(3)
trace = []


def plain(v):
    """Trace events (str keys, str and int values) as JSON."""
    if type(v) is dict:
        return "{" + ",".join(["%s:%s" % (_esc(k), plain(x)) for k, x in v.items()]) + "}"
    if type(v) is str:
        return _esc(v)
    return int.__repr__(v)


def finish(status, message=None, code=None, files=None):
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except BaseException:
            pass
    ended = {"status": status}
    if message is not None:
        ended["message"] = message[:500]
    if code is not None:
        ended["code"] = code
    if files:
        ended["files"] = files
    send(4, '{"ended":%s,"trace":[%s]}' % (plain(ended), ",".join([plain(e) for e in trace])))
    import posix
    posix._exit(0)


def described(e):
    try:
        return "%s: %s" % (type(e).__name__, e)
    except BaseException:
        return type(e).__name__


def where(e):
    """The program's line an exception came from, as text."""
    line, tb = None, e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<candidate>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return "" if line is None else " (line %d)" % line


def status_of(e):
    if isinstance(e, MemoryError):
        return "memory"
    if isinstance(e, PermissionError):
        return "refused"
    return "error"


def tracer_for(name, limit):
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
        if event != "call" or frame.f_code.co_filename != "<candidate>" or frame.f_code.co_name != name:
            return None
        calls[0] += 1
        call = calls[0]
        last = [None]

        def local(frame, event, arg):
            if len(trace) >= limit:
                return None
            if event == "line":
                if last[0] is not None:
                    trace.append({"call": call, "line": last[0], "locals": snapshot(frame)})
                last[0] = frame.f_lineno
            elif event == "return":
                if last[0] is not None:
                    trace.append({"call": call, "line": last[0], "locals": snapshot(frame),
                                  "returned": shown(arg)})
            elif event == "exception":
                trace.append({"call": call, "line": frame.f_lineno, "locals": snapshot(frame),
                              "raised": shown(arg[1])})
            return local
        return local
    return tracer


def answer(namespace, request):
    f = namespace.get(request["call"])
    if f is None:
        raise NameError("the program defines no `%s`" % request["call"])
    args = request["args"]
    value = f(*args, **dict(request.get("kwargs") or ()))
    after = [encode(a) if type(a) in (list, dict, set, bytearray) else "null" for a in args]
    return '{"value":%s,"after":[%s]}' % (encode(value), ",".join(after))


def serve(namespace):
    names = [k for k, v in list(namespace.items()) if type(k) is str and not k.startswith("__") and callable(v)]
    send(4, '{"ready":[%s]}' % ",".join([_esc(n) for n in names]))
    while True:
        line = requests.readline()
        if line is None:
            finish("error", "stepwise closed the channel")
        request = decode(line)
        if request.get("end"):
            sys.settrace(None)
            finish("ok")
        try:
            text = answer(namespace, request)
        except BaseException as e:
            text = '{"raised":[%s,%s]}' % (_esc(type(e).__name__), _esc(described(e)[len(type(e).__name__) + 2:][:500]))
        send(4, text)


def run_script(job):
    """A whole script, as `python3 script.py` runs it (SandboxFusion's run_code): __main__, its
    input on fd 0, a traceback on stderr and exit status 1 when it raises, sys.exit's status;
    `files` (name: base64) written to its folder first, `fetch_files` read back after."""
    import binascii
    import posix
    home = posix.getcwd()
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    code = 0
    try:
        for name, data in (job.get("files") or {}).items():
            with open(name, "wb") as f:
                f.write(binascii.a2b_base64(data))
        exec(compile(job["program"], "<main>", "exec"), namespace)
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif type(e.code) is int:
            code = e.code % 256
        else:
            try:
                print(e.code, file=sys.stderr)
            except BaseException:
                pass
            code = 1
    except BaseException:
        try:
            import traceback
            traceback.print_exc()
        except BaseException:
            pass
        code = 1
    fetched = {}
    for name in job.get("fetch_files") or ():
        try:
            with open(name if name.startswith("/") else home + "/" + name, "rb") as f:
                fetched[name] = binascii.b2a_base64(f.read(), newline=False).decode("ascii")
        except BaseException:
            pass
    finish("ok", code=code, files=fetched)


def main():
    job = decode(requests.readline() or "null")
    if job.get("script"):
        run_script(job)
    try:
        program = compile(job["program"], "<candidate>", "exec")
    except SyntaxError as e:
        finish("error", "SyntaxError: %s (line %s)" % (e.msg, e.lineno))
    except (ValueError, MemoryError) as e:
        finish(status_of(e), described(e))
    namespace = {"__name__": "__candidate__", "__builtins__": __builtins__}
    if job.get("trace_function"):
        sys.settrace(tracer_for(job["trace_function"], job["max_trace_events"]))
    try:
        exec(program, namespace)
    except BaseException as e:
        sys.settrace(None)
        finish(status_of(e), described(e) + where(e))
    serve(namespace)


main()
