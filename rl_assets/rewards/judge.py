"""The judge of assert- and call-style tests: two processes, each in a sandbox of its own, joined by two pipes.

    python3 -I judge.py serve REQUESTS REPLIES   # beside solution.py: runs the program, answers requests
    python3 -I judge.py judge REPLIES REQUESTS   # beside tests.json: runs the tests, one "<index> <0|1>" line each on stdout

The tests run in the judge's process, which never runs a line of the program: a name the program
defines is, to the tests, either a plain value or a handle. Plain values (None, bool, int, float,
complex, str, bytes, bytearray and lists, tuples, dicts, sets, frozensets of them) cross the pipe by
value and are rebuilt here as exact built-in types, so whatever the program returns compares with
the judge's own `==`. Anything else (functions, classes, instances) stays in the program's process
as a handle: the tests may call it, take its attributes and items, iterate it, take its len, str,
repr and bool; a handle equals only itself. Stdlib modules the program imported are imported here
instead, so `math.isclose` in a test is the real one. The tests' source, and so their expected
values, never reach the program's process. Arguments a call mutates (lists, dicts, sets,
bytearrays) are written back, so in-place tests work.

Standard library only: this file runs under the sandbox's system python3.
"""

import builtins
import importlib
import json
import os
import sys

MESSAGE_LIMIT = 16 << 20  # bytes of one request or reply: a returned list of a million numbers fits
GLOBAL_VALUE_LIMIT = 64 << 10  # a bigger plain global (a precomputed table) goes to the judge as a handle, not a copy


def encode(value, handle):
    """`value` as JSON: plain values by value (tagged where JSON has no such type), others through `handle(value)`."""
    if value is None:
        return None
    for kind in (bool, int, float, str):  # a subclass goes as its base type's value: its own __eq__ stays behind
        if isinstance(value, kind):
            return kind(value)
    if isinstance(value, (bytes, bytearray)):
        return {"bytearray" if isinstance(value, bytearray) else "bytes": bytes(value).hex()}
    if isinstance(value, complex):
        return {"complex": [value.real, value.imag]}
    if isinstance(value, list):
        return [encode(item, handle) for item in value]
    for kind in (tuple, set, frozenset):
        if isinstance(value, kind):
            return {kind.__name__: [encode(item, handle) for item in value]}
    if isinstance(value, dict):
        return {"dict": [[encode(k, handle), encode(v, handle)] for k, v in value.items()]}
    return handle(value)


def decode(data, handle):
    """The inverse of `encode`, building exact built-in types; `handle(tag)` turns a handle tag into an object."""
    if isinstance(data, list):
        return [decode(item, handle) for item in data]
    if not isinstance(data, dict):
        return data
    if "handle" in data:
        return handle(data)
    (kind, inner), = data.items()
    if kind in ("bytes", "bytearray"):
        return (bytes if kind == "bytes" else bytearray).fromhex(inner)
    if kind == "complex":
        return complex(*inner)
    if kind == "dict":
        return {decode(k, handle): decode(v, handle) for k, v in inner}
    return {"tuple": tuple, "set": set, "frozenset": frozenset}[kind](decode(item, handle) for item in inner)


def read_message(stream):
    line = stream.readline(MESSAGE_LIMIT + 1)
    if not line.endswith(b"\n"):
        raise EOFError("the other side ended, or sent a message over the limit")
    return json.loads(line)


def write_message(stream, message) -> None:
    stream.write(json.dumps(message).encode() + b"\n")
    stream.flush()


# --- the program's side ---------------------------------------------------------------------------


def serve(requests_fd: int, replies_fd: int) -> None:
    objects, numbers = [], {}

    def handle(value):
        if id(value) not in numbers:
            numbers[id(value)] = len(objects)
            objects.append(value)  # kept alive, so the id stays this object's
        tag = {"handle": numbers[id(value)]}
        if type(value) is type(sys):
            tag["module"] = value.__name__
        return tag

    namespace = {"__name__": "solution", "__builtins__": builtins}  # not "__main__": a main block needs input it won't get
    try:
        with open("solution.py") as source:
            exec(compile(source.read(), "solution.py", "exec"), namespace)
        failure = None
    except BaseException as error:  # SystemExit included: ending the program early is not passing
        failure = f"the program failed: {type(error).__name__}"
    requests, replies = os.fdopen(requests_fd, "rb"), os.fdopen(replies_fd, "wb")
    while True:
        try:
            request = read_message(requests)
        except (EOFError, ValueError):
            return
        try:
            if failure:
                raise RuntimeError(failure)
            value, mutated = answer(request, namespace, objects, handle)
            if request["op"] == "names":
                reply = {"ok": {"dict": [[name, _global(item, handle)] for name, item in value.items()]}}
            else:
                reply = {"ok": encode(value, handle), "mutated": mutated}
        except BaseException as error:
            reply = {"raise": [type(error).__name__, _message(error)]}
        write_message(replies, reply)


def answer(request: dict, namespace: dict, objects: list, handle):
    """Carry out one request; the value and, for a call, the new state of each mutable argument."""
    op, target = request["op"], objects[request["target"]] if "target" in request else None
    lookup = lambda tag: objects[tag["handle"]]  # noqa: E731
    if op == "names":
        return {name: value for name, value in namespace.items() if not name.startswith("__")}, None
    if op == "call":
        args = [decode(a, lookup) for a in request["args"]]
        kwargs = {k: decode(v, lookup) for k, v in request["kwargs"].items()}
        value = target(*args, **kwargs)
        mutable = (list, dict, set, bytearray)
        mutated = {"args": [encode(a, handle) if isinstance(a, mutable) else None for a in args],
                   "kwargs": {k: encode(v, handle) for k, v in kwargs.items() if isinstance(v, mutable)}}
        return value, mutated
    if op == "getattr":
        return getattr(target, request["name"]), None
    if op == "getitem":
        return target[decode(request["key"], lookup)], None
    operations = {"iter": list, "len": len, "str": str, "repr": repr, "bool": bool}
    return operations[op](target), None


def _global(value, handle):
    try:
        encoded = encode(value, handle)
        if len(json.dumps(encoded)) <= GLOBAL_VALUE_LIMIT:
            return encoded
    except (RecursionError, ValueError):
        pass
    return handle(value)


def _message(error: BaseException) -> str:
    try:
        return str(error)[:1000]
    except BaseException:
        return ""


# --- the judge's side -----------------------------------------------------------------------------


class RemoteError(Exception):
    """The program raised an exception that is not a built-in one, returned something unusable, or ended."""


class Program:
    """The judge's end of the pipes: asks the program's process, rebuilds its replies."""

    def __init__(self, replies_fd: int, requests_fd: int):
        self.replies, self.requests = os.fdopen(replies_fd, "rb"), os.fdopen(requests_fd, "wb")
        self.remotes = {}
        self.broken = False

    def remote(self, tag: dict):
        """A handle tag as an object here: the stdlib module it names, imported here, or a `Remote` (one per handle)."""
        module = tag.get("module")
        if isinstance(module, str) and module.partition(".")[0] in sys.stdlib_module_names:
            try:
                return importlib.import_module(module)
            except ImportError:
                pass
        number = tag["handle"]
        if type(number) is not int:
            raise RemoteError("a malformed handle")
        return self.remotes.setdefault(number, Remote(self, number))

    def ask(self, op: str, **fields):
        if self.broken:
            raise RemoteError("the program's process ended")
        try:
            write_message(self.requests, {"op": op, **fields})
            reply = read_message(self.replies)
        except (OSError, EOFError, ValueError) as error:
            self.broken = True  # a half-read reply would shift every later one
            raise RemoteError(f"the program's process ended: {error}") from None
        if "raise" in reply:
            name, message = (str(part) for part in reply["raise"][:2])
            error = getattr(builtins, name, None)
            if isinstance(error, type) and issubclass(error, Exception):  # so `except ValueError` in a test works
                raise error(message)
            raise RemoteError(f"{name}: {message}")
        return reply

    def value(self, op: str, **fields):
        return decode(self.ask(op, **fields)["ok"], self.remote)

    def encode(self, value):
        def handle(other):
            if isinstance(other, Remote) and other._program is self:
                return {"handle": other._number}
            raise TypeError(f"cannot pass a {type(other).__name__} to the program (only plain values and its own objects)")
        return encode(value, handle)

    def call(self, remote, args: tuple, kwargs: dict):
        reply = self.ask("call", target=remote._number, args=[self.encode(a) for a in args], kwargs={k: self.encode(v) for k, v in kwargs.items()})
        mutated = reply.get("mutated") or {}
        for old, new in [*zip(args, mutated.get("args") or []), *((kwargs[k], v) for k, v in (mutated.get("kwargs") or {}).items() if k in kwargs)]:
            if new is not None:
                _write_back(old, decode(new, self.remote))
        return decode(reply["ok"], self.remote)


def _write_back(old, new) -> None:
    if type(old) is not type(new):
        return
    if isinstance(old, (list, bytearray)):
        old[:] = new
    elif isinstance(old, (dict, set)):
        old.clear()
        old.update(new)


class Remote:
    """An object of the program's, seen from the judge: every operation goes to the program's process and back."""

    __slots__ = ("_program", "_number")

    def __init__(self, program: Program, number: int):
        self._program, self._number = program, number

    def __call__(self, *args, **kwargs):
        return self._program.call(self, args, kwargs)

    def __getattr__(self, name: str):
        if name.startswith("__"):  # dunder probes (copy, pickle, numpy) are not the program's to answer
            raise AttributeError(name)
        return self._program.value("getattr", target=self._number, name=name)

    def __getitem__(self, key):
        return self._program.value("getitem", target=self._number, key=self._program.encode(key))

    def __iter__(self):
        return iter(self._typed("iter", list))

    def __len__(self):
        return self._typed("len", int)

    def __bool__(self):
        return self._typed("bool", bool)

    def __str__(self):
        return self._typed("str", str)

    def __repr__(self):
        return self._typed("repr", str)

    def _typed(self, op: str, kind: type):
        value = self._program.value(op, target=self._number)
        if type(value) is not kind:
            raise RemoteError(f"{op}() of a program object gave a {type(value).__name__}")
        return value


def judge(replies_fd: int, requests_fd: int) -> None:
    verdicts = os.fdopen(os.dup(1), "w")  # the host reads verdicts here; whatever a test prints goes to stderr
    os.dup2(2, 1)
    with open("tests.json") as source:
        tests = json.load(source)
    program = Program(replies_fd, requests_fd)
    namespace = {"__name__": "__test__", "__builtins__": builtins}
    try:
        names = program.value("names")
        # Built-in names stay the judge's: a program's own `abs` or `isinstance` would decide the test.
        namespace.update({name: value for name, value in names.items() if not hasattr(builtins, name)})
    except BaseException:
        names = None
    for index, test in enumerate(tests):
        passed = names is not None and _passes(test, namespace, index)
        print(index, int(passed), file=verdicts, flush=True)


def _passes(test: dict, namespace: dict, index: int) -> bool:
    try:
        if "code" in test:
            exec(compile(test["code"], f"<test {index}>", "exec"), namespace)
            return True
        function = namespace.get(test["call"])
        if not isinstance(function, Remote):
            return False
        return _as_json(function(*test["args"], **test.get("kwargs", {}))) == test["output"]
    except BaseException:  # an AssertionError, the program's exception, SystemExit from a test: all fail
        return False


def _as_json(value):
    """Tuples as lists, recursively: call-style expected outputs are JSON, which has no tuples."""
    if isinstance(value, (list, tuple)):
        return [_as_json(item) for item in value]
    if isinstance(value, dict):
        return {key: _as_json(item) for key, item in value.items()}
    return value


if __name__ == "__main__":
    sys.set_int_max_str_digits(0)  # a correct answer may be a big integer; the CPU limit bounds the cost
    mode, first, second = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    (serve if mode == "serve" else judge)(first, second)
