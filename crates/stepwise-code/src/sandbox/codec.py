# Plain data across the sandbox's wall (stepwise-code), shared by both sides of it: the checker
# (trusted tests) and the candidate (the untrusted program). A value crosses as one line of
# ASCII JSON: null, booleans, strings, lists and floats as JSON; everything else plain Python
# has as a one-key object:
#   {"$n": hex} int past 64 bits   {"$f": "nan"|"inf"|"-inf"}   {"$t": [...]} tuple
#   {"$d": [[k, v], ...]} dict     {"$s": [...]} set   {"$z": [...]} frozenset
#   {"$b": hex} bytes   {"$y": hex} bytearray   {"$c": [re, im]} complex
#   {"$r": [start, stop, step]} range   {"$i": [...]} an iterator's items (a list iterator back)
# Objects of other types do not cross (Uncarried); subclasses of these types cross as their base
# type's data, so a value's own __eq__ or __repr__ never reaches the other side. Only _json (C)
# is imported: `json` costs the candidate 11 ms of start-up (it compiles regular expressions).
import _json
from posix import read as _read, write as _write

_esc = _json.encode_basestring_ascii
_INF = float("inf")
_BIG = 1 << 63
MAX_ITEMS = 1000000


class Uncarried(TypeError):
    pass


def _items(values, depth):
    return ",".join([encode(x, depth) for x in values])


def encode(v, depth=0):
    if depth > 200:
        raise Uncarried("a value nested more than 200 deep cannot cross the sandbox")
    t = type(v)
    if v is None:
        return "null"
    if t is bool:
        return "true" if v else "false"
    if t is int:
        if -_BIG < v < _BIG:
            return int.__repr__(v)
        return '{"$n":"%s"}' % format(v, "x")
    if t is float:
        if v != v:
            return '{"$f":"nan"}'
        if v == _INF or v == -_INF:
            return '{"$f":"%s"}' % ("inf" if v > 0 else "-inf")
        return float.__repr__(v)
    if t is str:
        return _esc(v)
    d = depth + 1
    if t is list:
        return "[" + _items(v, d) + "]"
    if t is tuple:
        return '{"$t":[' + _items(v, d) + "]}"
    if t is dict:
        return '{"$d":[' + ",".join(["[%s,%s]" % (encode(k, d), encode(x, d)) for k, x in v.items()]) + "]}"
    if t is set:
        return '{"$s":[' + _items(v, d) + "]}"
    if t is frozenset:
        return '{"$z":[' + _items(v, d) + "]}"
    if t is bytes:
        return '{"$b":"%s"}' % v.hex()
    if t is bytearray:
        return '{"$y":"%s"}' % v.hex()
    if t is complex:
        return '{"$c":[%s,%s]}' % (encode(v.real), encode(v.imag))
    if t is range:
        return '{"$r":[%s,%s,%s]}' % (encode(v.start), encode(v.stop), encode(v.step))
    return _other(v, t, d)


_BASES = ((int, int), (float, float), (str, str.__str__), (dict, dict), (list, list), (tuple, tuple),
          (set, set), (frozenset, frozenset), (bytes, bytes), (bytearray, bytearray), (complex, complex))


def _other(v, t, d):
    for base, make in _BASES:
        if isinstance(v, base):
            return encode(make(v), d)
    if t.__module__ == "numpy" and hasattr(v, "tolist"):
        return encode(v.tolist(), d)
    if hasattr(t, "__next__") and hasattr(t, "__iter__"):
        items = []
        for x in v:
            items.append(x)
            if len(items) > MAX_ITEMS:
                raise Uncarried("an iterator of more than %d items cannot cross the sandbox" % MAX_ITEMS)
        return '{"$i":[' + _items(items, d) + "]}"
    raise Uncarried("a %s cannot cross the sandbox: only plain data does (None, bool, int, float, "
                    "complex, str, bytes, ranges, iterators, and lists, tuples, dicts and sets of "
                    "them)" % t.__name__)


def _tagged(o):
    if len(o) != 1:
        return o
    (k, x), = o.items()
    if k[:1] != "$":
        return o
    if k == "$t":
        return tuple(x)
    if k == "$d":
        return {(tuple(a) if type(a) is list else a): b for a, b in x}
    if k == "$s":
        return set(x)
    if k == "$z":
        return frozenset(x)
    if k == "$n":
        return int(x, 16)
    if k == "$f":
        return float(x)
    if k == "$b":
        return bytes.fromhex(x)
    if k == "$y":
        return bytearray.fromhex(x)
    if k == "$c":
        return complex(*x)
    if k == "$r":
        return range(*x)
    if k == "$i":
        return iter(x)
    raise ValueError("unknown tag %r" % k[:20])


def _no_constant(name):
    raise ValueError("%s is not JSON" % name)


class _Context:
    strict = True
    object_hook = staticmethod(_tagged)
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = staticmethod(_no_constant)
    memo = {}


_scan = _json.make_scanner(_Context())


def decode(text):
    """One message (a str) as Python data; ValueError when it is not one."""
    try:
        value, end = _scan(text, 0)
    except StopIteration:
        raise ValueError("not a JSON value")
    if text[end:].strip():
        raise ValueError("text after the value")
    return value


class Lines:
    """Lines read from a file descriptor, without Python's buffered files (the other side writes
    one message a line)."""

    def __init__(self, fd):
        self.fd, self.buffer = fd, b""

    def readline(self):
        """The next line as str, or None at the end."""
        while b"\n" not in self.buffer:
            chunk = _read(self.fd, 1 << 16)
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode("utf-8", "replace")


def send(fd, text):
    data = (text + "\n").encode("ascii", "backslashreplace")
    while data:
        data = data[_write(fd, data):]
