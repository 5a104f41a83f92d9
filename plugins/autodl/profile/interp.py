"""A small evaluator over a training script's syntax tree: the values its call sites pass (batch sizes, worker counts,
shapes, the model's constructor arguments).

Nothing of the script is imported or executed. The evaluator understands constants, ``argparse`` defaults, helper
functions and script classes' ``__init__``; a ``paddle`` call (a layer, a tensor) is :class:`Opaque`: what the model
is, Paddle itself says in the sandboxed probe and dry run. What it cannot follow becomes :class:`Opaque`.
"""

from __future__ import annotations

import ast
import math
import operator
from dataclasses import dataclass, field
from typing import Any

from autodl.profile import layers as L
from autodl.profile.bounds import MAX_ELEMENTS, Budget, result_too_big, too_big

MAX_LOOP = 10_000


class Opaque:
    """A value the evaluator cannot know (I/O, random numbers, unknown calls)."""

    def __init__(self, what: str = "?"):
        self.what = what

    def __repr__(self) -> str:
        return f"<opaque {self.what}>"

    def __bool__(self) -> bool:
        return False


@dataclass(eq=False)
class Mod:
    """A dotted reference into a library, e.g. ``paddle.nn.functional``."""

    path: str


@dataclass(eq=False)
class ClassInfo:
    name: str
    node: ast.ClassDef
    bases: list[Any]
    methods: dict[str, ast.FunctionDef | ast.AsyncFunctionDef]

    def find(self, meth: str) -> tuple[ClassInfo, ast.FunctionDef | ast.AsyncFunctionDef] | None:
        if meth in self.methods:
            return self, self.methods[meth]
        for b in self.bases:
            if isinstance(b, ClassInfo):
                r = b.find(meth)
                if r:
                    return r
        return None

    def is_layer(self) -> bool:
        for b in self.bases:
            if isinstance(b, Mod) and b.path.split(".")[-1] == "Layer":
                return True
            if isinstance(b, ClassInfo) and b.is_layer():
                return True
        return False


@dataclass(eq=False)
class UserObj:
    """An instance of a script class: the attributes its ``__init__`` set."""

    cls: ClassInfo
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class FuncRef:
    node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
    env: dict[str, Any] | None = None


@dataclass(eq=False)
class Bound:
    obj: Any
    func: Any
    cls: ClassInfo | None = None


class ArgsNS:
    """What ``parser.parse_args()`` returns: argparse defaults by destination name."""

    def __init__(self, values: dict[str, Any]):
        self.values = values


class _Return(Exception):
    def __init__(self, value):
        self.value = value


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_CMP = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
        ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not,
        ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}

DATASET_SHAPES = {
    "MNIST": [1, 28, 28], "FashionMNIST": [1, 28, 28], "Cifar10": [3, 32, 32], "Cifar100": [3, 32, 32],
    "Flowers": [3, 224, 224], "VOC2012": [3, 224, 224], "DatasetFolder": [3, 224, 224], "ImageFolder": [3, 224, 224],
}
"""Per-sample image shapes of ``paddle.vision.datasets`` (their documented sample formats)."""

class Interp:
    """Evaluates one module's constants and constructions."""

    def __init__(self, tree: ast.Module, budget: Budget | None = None):
        self.tree = tree
        self.budget = budget or Budget()  # steps, time and memory of the whole analysis (autodl.profile.bounds)
        self.globals: dict[str, Any] = {}
        self.argparse: dict[str, Any] = {}
        self.argparse_flags: dict[str, str] = {}  # destination -> the option as written ("--batch-size")
        self.argparse_required: list[str] = []  # options declared required=True, as written
        self._collect_argparse()
        self._load_module()

    # ----------------------------------------------------------------------------- module level
    def _collect_argparse(self) -> None:
        """``add_argument`` calls anywhere in the script: each option's default by destination, its flag as written
        and whether it is required."""
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
                dest, flag = _option_names(node)
                if dest is None:
                    continue
                if flag is not None:
                    self.argparse_flags[dest] = flag
                    if any(kw.arg == "required" and isinstance(kw.value, ast.Constant) and kw.value.value is True
                           for kw in node.keywords):
                        self.argparse_required.append(flag)
                self.argparse[dest] = self._option_default(node)

    def _option_default(self, node: ast.Call) -> Any:
        """An ``add_argument`` call's default as the evaluator reads it (``store_true``: False; none: None)."""
        default = None
        for kw in node.keywords:
            if kw.arg == "default":
                try:
                    default = self.eval(kw.value, {})
                except Exception:
                    default = Opaque("argparse default")
            if kw.arg == "action" and isinstance(kw.value, ast.Constant) and kw.value.value == "store_true" \
                    and not any(k.arg == "default" for k in node.keywords):
                default = False
        return default

    def _load_module(self) -> None:
        for stmt in self.tree.body:
            self.load_stmt(stmt)

    def load_stmt(self, stmt: ast.stmt) -> None:
        """Take one module-level statement in: an import, a definition or a safe assignment."""
        if isinstance(stmt, ast.Import):
            self._load_import(stmt)
        elif isinstance(stmt, ast.ImportFrom):
            base = stmt.module or ""
            for a in stmt.names:
                self.globals[a.asname or a.name] = Mod(f"{base}.{a.name}" if base else a.name)
        elif isinstance(stmt, ast.ClassDef):
            self._load_class(stmt)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self.globals[stmt.name] = FuncRef(stmt)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            self._load_constant(stmt)
        elif isinstance(stmt, ast.If):
            # `if __name__ == "__main__":` and try/except import guards: load definitions only
            for s in stmt.body:
                if isinstance(s, (ast.Import, ast.ImportFrom, ast.ClassDef, ast.FunctionDef)):
                    self.load_stmt(s)
        elif isinstance(stmt, ast.Try):
            for s in stmt.body:
                self.load_stmt(s)

    def _load_import(self, stmt: ast.Import) -> None:
        """``import a.b`` binds ``a``; ``import a.b as c`` binds ``c`` to ``a.b``."""
        for a in stmt.names:
            if a.asname:
                self.globals[a.asname] = Mod(a.name)
            else:
                top = a.name.split(".")[0]
                self.globals[top] = Mod(top)

    def _load_class(self, stmt: ast.ClassDef) -> None:
        """A script-defined class: its evaluated bases (Opaque where unknown) and its methods by name."""
        bases: list[Any] = []
        for b in stmt.bases:
            try:
                bases.append(self.eval(b, {}))
            except Exception:
                bases.append(Opaque("base"))
        methods = {n.name: n for n in stmt.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        self.globals[stmt.name] = ClassInfo(stmt.name, stmt, bases, methods)

    def _load_constant(self, stmt: ast.Assign | ast.AnnAssign) -> None:
        """A module-level assignment whose value is safe to evaluate (:meth:`only_safe`); Opaque when it fails."""
        value = stmt.value
        if value is None:
            return
        if self.only_safe(value):
            try:
                v = self.eval(value, {})
            except Exception:
                v = Opaque("module constant")
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for t in targets:
                try:
                    self.assign(t, v, self.globals)
                except Exception:
                    pass

    def only_safe(self, node: ast.AST) -> bool:
        """Module-level values are evaluated only when they build no layer and call nothing unknown."""
        for n in ast.walk(node):
            if isinstance(n, ast.Call):
                f = n.func
                name = f.attr if isinstance(f, ast.Attribute) else (f.id if isinstance(f, ast.Name) else "")
                if name not in {"int", "float", "str", "len", "min", "max", "tuple", "list", "dict", "range",
                                "parse_args", "parse_known_args", "round", "abs", "sum", "ArgumentParser",
                                "get", "getenv"}:
                    return False
        return True

    # --------------------------------------------------------------------------------- helpers
    def lookup(self, name: str, env: dict) -> Any:
        if name in env:
            return env[name]
        if name in self.globals:
            return self.globals[name]
        if name in _BUILTINS:
            return _BUILTINS[name]
        raise NameError(name)

    def assign(self, target: ast.AST, value: Any, env: dict) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)):
            if isinstance(value, Opaque):
                vals = [value] * len(target.elts)
            else:
                vals = list(value)
            for t, v in zip(target.elts, vals):
                self.assign(t, v, env)
        elif isinstance(target, ast.Attribute):
            obj = self.eval(target.value, env)
            self.setattr(obj, target.attr, value)
        elif isinstance(target, ast.Subscript):
            obj = self.eval(target.value, env)
            key = self.eval(target.slice, env)
            if isinstance(obj, (list, dict)):
                obj[key] = value
        elif isinstance(target, ast.Starred):
            self.assign(target.value, value, env)

    def setattr(self, obj: Any, attr: str, value: Any) -> None:
        if isinstance(obj, UserObj):
            obj.attrs[attr] = value
        elif isinstance(obj, ArgsNS):
            obj.values[attr] = value

    def getattr(self, obj: Any, attr: str) -> Any:
        if attr in ("parse_args", "parse_known_args") and not isinstance(obj, (UserObj, ClassInfo)):
            return Mod(f"argparse.{attr}")
        if isinstance(obj, Mod):
            return Mod(f"{obj.path}.{attr}")
        if isinstance(obj, ArgsNS):
            return obj.values.get(attr, Opaque(f"args.{attr}"))
        if isinstance(obj, UserObj):
            return self._user_attr(obj, attr)
        if isinstance(obj, ClassInfo):
            found = obj.find(attr)
            return FuncRef(found[1]) if found else Opaque(attr)
        if isinstance(obj, (list, dict, str)):
            return Bound(obj, attr)
        return Opaque(f".{attr}")

    def _user_attr(self, obj: UserObj, attr: str) -> Any:
        """An attribute of a script-defined object: set in ``__init__``, else a method of its class, else bound."""
        if attr in obj.attrs:
            return obj.attrs[attr]
        found = obj.cls.find(attr)
        if found:
            return Bound(obj, FuncRef(found[1]), found[0])
        if attr == "training":
            return True
        return Bound(obj, attr)

    # ------------------------------------------------------------------------------ expressions
    def eval(self, node: ast.AST, env: dict) -> Any:
        self.budget.step()
        m = getattr(self, f"_e_{type(node).__name__}", None)
        if m is None:
            return Opaque(type(node).__name__)
        return m(node, env)

    def _e_Constant(self, n, env):
        return n.value

    def _e_Name(self, n, env):
        try:
            return self.lookup(n.id, env)
        except NameError:
            return Opaque(n.id)

    def _e_Attribute(self, n, env):
        return self.getattr(self.eval(n.value, env), n.attr)

    def _e_Tuple(self, n, env):
        return tuple(self._elts(n.elts, env))

    def _e_List(self, n, env):
        return list(self._elts(n.elts, env))

    def _elts(self, elts, env):
        out = []
        for e in elts:
            if isinstance(e, ast.Starred):
                out.extend(self.eval(e.value, env))
            else:
                out.append(self.eval(e, env))
        return out

    def _e_Dict(self, n, env):
        return {self.eval(k, env): self.eval(v, env) for k, v in zip(n.keys, n.values) if k is not None}

    def _e_JoinedStr(self, n, env):
        return Opaque("f-string")

    def _e_Lambda(self, n, env):
        return FuncRef(n, dict(env))

    def _e_IfExp(self, n, env):
        return self.eval(n.body if self.truth(self.eval(n.test, env)) else n.orelse, env)

    def _e_BoolOp(self, n, env):
        if isinstance(n.op, ast.And):
            v = True
            for e in n.values:
                v = self.eval(e, env)
                if not self.truth(v):
                    return v
            return v
        v = False
        for e in n.values:
            v = self.eval(e, env)
            if self.truth(v):
                return v
        return v

    def truth(self, v: Any) -> bool:
        if isinstance(v, Opaque):
            return False
        return bool(v)

    def _e_UnaryOp(self, n, env):
        v = self.eval(n.operand, env)
        if isinstance(n.op, ast.Not):
            return not self.truth(v)
        if isinstance(v, Opaque):
            return v
        return -v if isinstance(n.op, ast.USub) else (+v if isinstance(n.op, ast.UAdd) else ~v)

    def _e_BinOp(self, n, env):
        a, b = self.eval(n.left, env), self.eval(n.right, env)
        return self.binop(n.op, a, b)

    def binop(self, op, a, b):
        if isinstance(a, Opaque) or isinstance(b, Opaque):
            return Opaque("arith")
        f = _BINOPS.get(type(op))
        if f is None:
            return Opaque("op")
        if result_too_big(type(op), a, b):
            return Opaque("a value too large to follow")
        try:
            return f(a, b)
        except OverflowError:
            return Opaque("arith overflow")

    def _e_Compare(self, n, env):
        left = self.eval(n.left, env)
        for op, right_node in zip(n.ops, n.comparators):
            right = self.eval(right_node, env)
            if isinstance(left, Opaque) or isinstance(right, Opaque):
                if isinstance(op, (ast.Is, ast.IsNot)) and right is None:
                    r = (left is None) == isinstance(op, ast.Is)
                    if not r:
                        return False
                    left = right
                    continue
                return Opaque("compare")
            try:
                if not _CMP[type(op)](left, right):
                    return False
            except Exception:
                return Opaque("compare")
            left = right
        return True

    def _e_Subscript(self, n, env):
        obj = self.eval(n.value, env)
        key = self.eval(n.slice, env)
        if isinstance(obj, Opaque) or isinstance(key, Opaque):
            return Opaque("subscript")
        try:
            return obj[key]
        except Exception:
            return Opaque("subscript")

    def _e_Slice(self, n, env):
        f = lambda x: None if x is None else self.eval(x, env)
        return slice(f(n.lower), f(n.upper), f(n.step))

    def _e_ListComp(self, n, env):
        return self._comp(n, env, list)

    def _e_GeneratorExp(self, n, env):
        return self._comp(n, env, list)

    def _e_SetComp(self, n, env):
        return Opaque("setcomp")

    def _comp(self, n, env, kind):
        out = []
        local = dict(env)

        def rec(i):
            if i == len(n.generators):
                out.append(self.eval(n.elt, local))
                return
            g = n.generators[i]
            it = self.eval(g.iter, local)
            for count, v in enumerate(self.iterate(it)):
                if count > MAX_LOOP:
                    raise L.Unsupported("comprehension too long")
                self.assign(g.target, v, local)
                if all(self.truth(self.eval(c, local)) for c in g.ifs):
                    rec(i + 1)

        rec(0)
        return kind(out)

    def iterate(self, it):
        if isinstance(it, Opaque):
            raise L.Unsupported("iteration over an unknown value")
        if too_big(it):
            raise L.Unsupported(f"iteration over more than {MAX_ELEMENTS:,} items")
        if isinstance(it, dict):
            return list(it)
        return list(it)

    def _e_Starred(self, n, env):
        return self.eval(n.value, env)

    def _e_Call(self, n, env):
        func = self.eval(n.func, env)
        args, kwargs = [], {}
        for a in n.args:
            if isinstance(a, ast.Starred):
                v = self.eval(a.value, env)
                args.extend(self.iterate(v))
            else:
                args.append(self.eval(a, env))
        for kw in n.keywords:
            if kw.arg is None:
                v = self.eval(kw.value, env)
                if isinstance(v, dict):
                    kwargs.update(v)
            else:
                kwargs[kw.arg] = self.eval(kw.value, env)
        return self.call(func, args, kwargs)

    # ------------------------------------------------------------------------------------ calls
    def call(self, func, args, kwargs):
        if isinstance(func, Mod):
            return self.call_lib(func.path, args, kwargs)
        if isinstance(func, ClassInfo):
            return self.instantiate(func, args, kwargs)
        if isinstance(func, FuncRef):
            return self.call_func(func, args, kwargs)
        if isinstance(func, Bound):
            return self.call_method(func, args, kwargs)
        if isinstance(func, UserObj):
            return Opaque("forward")  # the forward pass is what the dry run measures, never followed here
        if callable(func) and getattr(func, "_autodl_builtin", False):
            return func(self, *args, **kwargs)
        return Opaque("call")

    def call_func(self, f: FuncRef, args, kwargs, self_obj=None):
        self.budget.enter_call()
        try:
            return self._call_func(f, args, kwargs, self_obj)
        finally:
            self.budget.leave_call()

    def _call_func(self, f: FuncRef, args, kwargs, self_obj=None):
        node = f.node
        env: dict[str, Any] = dict(f.env or {})
        a = node.args
        params = [p.arg for p in a.posonlyargs + a.args]
        defaults = a.defaults
        dmap = {}
        for p, d in zip(params[len(params) - len(defaults):], defaults):
            dmap[p] = d
        allargs = ([self_obj] if self_obj is not None else []) + list(args)
        for i, p in enumerate(params):
            if i < len(allargs):
                env[p] = allargs[i]
            elif p in kwargs:
                env[p] = kwargs.pop(p)
            elif p in dmap:
                env[p] = self.eval(dmap[p], {})
            else:
                env[p] = Opaque(f"missing argument {p}")
        if a.vararg:
            env[a.vararg.arg] = tuple(allargs[len(params):])
        for k, kw_default in zip(a.kwonlyargs, a.kw_defaults):
            env[k.arg] = kwargs.pop(k.arg) if k.arg in kwargs else (
                self.eval(kw_default, {}) if kw_default is not None else Opaque(k.arg))
        if a.kwarg:
            env[a.kwarg.arg] = dict(kwargs)
        if isinstance(node, ast.Lambda):
            return self.eval(node.body, env)
        try:
            self.exec_block(node.body, env)
        except _Return as r:
            return r.value
        return None

    def instantiate(self, cls: ClassInfo, args, kwargs):
        obj = UserObj(cls)
        init = cls.find("__init__")
        if init:
            self.call_func(FuncRef(init[1]), args, dict(kwargs), self_obj=obj)
        return obj

    def call_method(self, b: Bound, args, kwargs):
        obj, f = b.obj, b.func
        if isinstance(f, FuncRef):
            return self.call_func(f, args, dict(kwargs), self_obj=obj)
        name = f
        if isinstance(obj, list):
            return self._list_method(obj, name, args)
        if isinstance(obj, dict):
            return self._dict_method(obj, name, args)
        if isinstance(obj, UserObj):
            return self._user_method(obj, name, args, kwargs)
        if isinstance(obj, str):
            return Opaque("str method")
        return Opaque(str(name))

    def _list_method(self, obj: list, name: str, args: list) -> None:
        """``append``/``extend``/``insert`` change the list; other list methods are ignored (None)."""
        if name == "append":
            obj.append(args[0])
        elif name == "extend":
            obj.extend(self.iterate(args[0]))
        elif name == "insert":
            obj.insert(args[0], args[1])

    @staticmethod
    def _dict_method(obj: dict, name: str, args: list) -> Any:
        """``get``/``items``/``keys``/``values`` of a dict the script built; Opaque for the rest."""
        if name == "get":
            return obj.get(args[0], args[1] if len(args) > 1 else None)
        if name == "items":
            return list(obj.items())
        if name in ("keys", "values"):
            return list(getattr(obj, name)())
        return Opaque("dict method")

    def _user_method(self, obj: UserObj, name: str, args: list, kwargs: dict) -> Any:
        """The ``paddle.nn.Layer`` methods a script-defined layer inherits and ``__init__`` calls."""
        if name == "add_sublayer":
            sub = args[1] if len(args) > 1 else kwargs.get("sublayer")
            self.setattr(obj, str(args[0]), sub)
            return sub
        if name in ("create_parameter", "register_buffer"):
            return None
        if name in ("train", "eval"):
            return obj
        if name == "__init__":
            return None
        return Opaque(name)

    def call_lib(self, path: str, args, kwargs):
        parts = path.split(".")
        last = parts[-1]
        if last == "super":
            return Opaque("super")
        if last == "ArgumentParser":
            return Opaque("parser")
        if last in ("parse_args",):
            return ArgsNS(dict(self.argparse))
        if last == "parse_known_args":
            return (ArgsNS(dict(self.argparse)), [])
        if last in ("getenv", "get") and parts[0] == "os":
            return args[1] if len(args) > 1 else Opaque("env")
        if parts[0] == "paddle" or parts[0] == "F":
            return Opaque(path)  # a layer or a tensor: Paddle's to say (the probe, the dry run)
        if parts[0] == "math" and hasattr(math, last):
            if any(too_big(a) for a in args) or (last in ("factorial", "comb", "perm") and
                                                 any(isinstance(a, int) and a > 10_000 for a in args)):
                return Opaque("math")
            try:
                return getattr(math, last)(*args)
            except Exception:
                return Opaque("math")
        return Opaque(path)

    # -------------------------------------------------------------------------------- statements
    def exec_block(self, body, env):
        for stmt in body:
            self.exec_stmt(stmt, env)

    def exec_stmt(self, s, env):
        self.budget.step()
        m = getattr(self, f"_x_{type(s).__name__}", None)
        if m is not None:
            m(s, env)
        # pass, assert, raise, delete, global: nothing to model

    def _x_Assign(self, s: ast.Assign, env: dict) -> None:
        v = self.eval(s.value, env)
        for t in s.targets:
            self.assign(t, v, env)

    def _x_AnnAssign(self, s: ast.AnnAssign, env: dict) -> None:
        if s.value is not None:
            self.assign(s.target, self.eval(s.value, env), env)

    def _x_AugAssign(self, s: ast.AugAssign, env: dict) -> None:
        cur = self.eval(s.target, env) if not isinstance(s.target, ast.Name) else self._e_Name(s.target, env)
        self.assign(s.target, self.binop(s.op, cur, self.eval(s.value, env)), env)

    def _x_Expr(self, s: ast.Expr, env: dict) -> None:
        self.eval(s.value, env)

    def _x_Return(self, s: ast.Return, env: dict) -> None:
        raise _Return(self.eval(s.value, env) if s.value is not None else None)

    def _x_If(self, s: ast.If, env: dict) -> None:
        self.exec_block(s.body if self.truth(self.eval(s.test, env)) else s.orelse, env)

    def _x_For(self, s: ast.For, env: dict) -> None:
        it = self.iterate(self.eval(s.iter, env))
        for count, v in enumerate(it):
            if count > MAX_LOOP:
                raise L.Unsupported("loop too long")
            self.assign(s.target, v, env)
            try:
                self.exec_block(s.body, env)
            except _Break:
                break
            except _Continue:
                continue

    def _x_While(self, s: ast.While, env: dict) -> None:
        raise L.Unsupported(f"while loop at line {s.lineno}")

    def _x_Break(self, s: ast.Break, env: dict) -> None:
        raise _Break()

    def _x_Continue(self, s: ast.Continue, env: dict) -> None:
        raise _Continue()

    def _x_With(self, s: ast.With | ast.AsyncWith | ast.Try, env: dict) -> None:
        self.exec_block(s.body, env)

    _x_AsyncWith = _x_With
    _x_Try = _x_With

    def _x_FunctionDef(self, s: ast.FunctionDef | ast.AsyncFunctionDef, env: dict) -> None:
        env[s.name] = FuncRef(s, env)

    _x_AsyncFunctionDef = _x_FunctionDef

    def _x_Import(self, s: ast.Import | ast.ImportFrom, env: dict) -> None:
        """A function-level import binds its names in the function's locals, not the module's globals."""
        saved = dict(self.globals)
        self.load_stmt(s)
        for k, v in self.globals.items():
            if saved.get(k) is not v:
                env[k] = v
        self.globals = saved

    _x_ImportFrom = _x_Import


def _option_names(node: ast.Call) -> tuple[str | None, str | None]:
    """An ``add_argument`` call's destination (``dest=``, else its first long option's name) and its option as
    written (the first long one, else the first name)."""
    names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    longs = [n for n in names if n.startswith("--")]
    flag = longs[0] if longs else (names[0] if names else None)
    dest = next((kw.value.value for kw in node.keywords if kw.arg == "dest" and isinstance(kw.value, ast.Constant)
                 and isinstance(kw.value.value, str)), None)
    if dest is None and flag is not None:
        dest = flag.lstrip("-").replace("-", "_")
    return dest, flag


def _builtin(f):
    f._autodl_builtin = True
    return f


@_builtin
def _range(interp, *a):
    if any(not isinstance(v, int) for v in a):
        raise L.Unsupported("range() over an unknown bound")
    return range(*a)


@_builtin
def _len(interp, x):
    if isinstance(x, Opaque):
        return Opaque("len")
    try:
        return len(x)
    except OverflowError:  # len(range(10**20))
        return Opaque("len")


def _pure(fn):
    @_builtin
    def f(interp, *a, **k):
        if any(isinstance(v, Opaque) or too_big(v) for v in a):
            return Opaque(fn.__name__)
        try:
            return fn(*a, **k)
        except Exception:
            return Opaque(fn.__name__)
    return f


@_builtin
def _isinstance(interp, obj, cls):
    return Opaque("isinstance")


@_builtin
def _super(interp, *a):
    return Opaque("super")


@_builtin
def _print(interp, *a, **k):
    return None


@_builtin
def _getattr(interp, obj, name, *default):
    v = interp.getattr(obj, name)
    if isinstance(v, (Opaque, Bound)) and default:
        return default[0]
    return v


@_builtin
def _zip(interp, *its):
    return list(zip(*[interp.iterate(i) for i in its]))


@_builtin
def _enumerate(interp, it, start=0):
    return list(enumerate(interp.iterate(it), start))


@_builtin
def _list(interp, it=()):
    return list(interp.iterate(it))


@_builtin
def _tuple(interp, it=()):
    return tuple(interp.iterate(it))


_BUILTINS: dict[str, Any] = {
    "range": _range, "len": _len, "int": _pure(int), "float": _pure(float), "str": _pure(str), "bool": _pure(bool),
    "min": _pure(min), "max": _pure(max), "sum": _pure(sum), "abs": _pure(abs), "round": _pure(round),
    "list": _list, "tuple": _tuple, "dict": _pure(dict), "zip": _zip, "enumerate": _enumerate,
    "isinstance": _isinstance, "super": _super, "print": _print, "getattr": _getattr, "reversed": _pure(lambda x: list(reversed(x))),
    "True": True, "False": False, "None": None, "sorted": _pure(sorted), "hasattr": _pure(lambda o, n: False),
}
