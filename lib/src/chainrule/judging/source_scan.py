"""What a student's source code reaches for, read from the source itself (no code runs).

Two questions the grader asks of every cell a student wrote:

- :func:`library_uses`: does it use one of the library's own implementations (the library's
  solution of the exercise)? An import of a ``library`` module anywhere in the student's code
  counts, at the top of a cell or inside a function, under any alias, reached as an attribute
  (``chainrule.duality.gather_from_ranks``) or named in a string; so does importing code by
  name (``importlib``, ``__import__``) or running code from a string (``exec``, ``eval``),
  which could hide one.
- :func:`reaches_into_grader`: does it reach into the kernel or the grading machinery: IPython's
  input transformers, exiting the interpreter, signals, frames, ``sys.modules``,
  ``ctypes``, resource limits, new processes, code run from strings, classes whose objects
  decide how they compare (``__eq__``), or rebinding attributes of imported modules
  (``np.allclose = ...``) and the names the notebook's own cells define (the checks)?

Both return :class:`Finding` s that name the cell and the line, for the feedback and for the
instructor's summary.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from chainrule.judging.cells import bindings, parse_cell

#: Calls and attributes that run or import code chosen at run time.
DYNAMIC_CODE = frozenset(["exec", "eval", "compile", "__import__", "importlib"])

#: Dotted names (or their first parts) that reach into the kernel or the grader.
GRADER_REACH = {
    "get_ipython": "IPython's shell (it can rewrite the cells that follow)",
    "input_transformers_post": "IPython's input transformers (they rewrite later cells)",
    "input_transformers_cleanup": "IPython's input transformers (they rewrite later cells)",
    "ast_transformers": "IPython's AST transformers (they rewrite later cells)",
    "sys.exit": "exiting the interpreter",
    "os._exit": "exiting the interpreter",
    "os.kill": "signals to processes",
    "os.killpg": "signals to processes",
    "os.fork": "new processes",
    "os.setsid": "leaving the kernel's session",
    "os.system": "running a shell command",
    "subprocess": "running other programs",
    "signal": "signal handlers",
    "ctypes": "raw memory access (ctypes)",
    "sys.modules": "the table of loaded modules",
    "sys.settrace": "tracing other code",
    "sys.setprofile": "tracing other code",
    "sys._getframe": "other frames",
    "inspect.currentframe": "other frames",
    "gc.get_referrers": "other objects through the garbage collector",
    "gc.get_objects": "other objects through the garbage collector",
    "builtins": "the built-in names",
    "__builtins__": "the built-in names",
    "resource.setrlimit": "the resource limits",
    "sqlite3": "opening databases (the gradebook is one)",
}
#: Text that imitates a grader's verdict.
VERDICT_LIKE = re.compile(
    r"(?i)(tests? (have )?passed|passes all|all tests|success!|\d+(\.\d+)?\s*/\s*\d+\s*points?"
    r"|full marks|validation (passed|succeeded))"
)
#: A string that names a file outside the student's own folder.
OUTSIDE_PATH = re.compile(r"^/(?!home/student(/|$))[\w.\-]+(/[\w.\-*]*)*$")


@dataclass(frozen=True)
class Finding:
    """One place in the student's code: the cell, the line, what it does."""

    cell: str
    line: int
    what: str
    code: str

    def describe(self) -> str:
        """E.g. ``cell reduce_local_means, line 3: imports chainrule.duality (`import ...`)``."""
        return f"cell {self.cell}, line {self.line}: {self.what} (`{self.code}`)"


def _parse(source: str) -> ast.Module | None:
    """The cell's syntax tree as IPython runs it (:func:`chainrule.cells.parse_cell`), or
    ``None`` if it does not parse."""
    return parse_cell(source).tree


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the string constants that are docstrings or bare string statements (text
    for a reader, like a comment)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            if isinstance(node.value.value, str):
                found.add(id(node.value))
    return found


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of attributes on a name, else ``None``."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _in(module: str, prefixes: Iterable[str]) -> str | None:
    for prefix in prefixes:
        if module == prefix or module.startswith(prefix + "."):
            return prefix
    return None


def _line_of(source: str, line: int) -> str:
    lines = source.splitlines()
    return lines[line - 1].strip()[:120] if 0 < line <= len(lines) else ""


class _Aliases(ast.NodeVisitor):
    """Names bound by imports in a cell: alias → module path (``d`` → ``chainrule.duality``)."""

    def __init__(self) -> None:
        self.aliases: dict[str, str] = {}

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.asname:
                self.aliases[alias.asname] = alias.name
            else:
                first = alias.name.split(".")[0]
                self.aliases[first] = first

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            self.aliases[alias.asname or alias.name] = f"{node.module or ''}.{alias.name}"


def _module_aliases(trees: Iterable[ast.Module]) -> dict[str, str]:
    visitor = _Aliases()
    for tree in trees:
        visitor.visit(tree)
    return visitor.aliases


def library_uses(
    cells: Sequence[tuple[str, str]],
    library: Sequence[str],
    allowed: Sequence[str] = (),
    context: Sequence[tuple[str, str]] = (),
) -> list[Finding]:
    """Places in ``cells`` (``(label, source)`` pairs) that use a ``library`` module.

    ``context`` holds the notebook's other cells: names they import (``from chainrule.duality
    import f as g``, ``import chainrule``) count in ``cells`` too. ``allowed`` names modules
    the exercise lets the student use even when they lie under a library prefix.
    """
    pairs = tuple((str(label), str(source)) for label, source in cells)
    others = tuple((str(label), str(source)) for label, source in context)
    return list(_library_uses(pairs, tuple(library), tuple(allowed), others))


@functools.lru_cache(maxsize=256)
def _library_uses(
    cells: tuple[tuple[str, str], ...],
    library: tuple[str, ...],
    allowed: tuple[str, ...],
    context: tuple[tuple[str, str], ...],
) -> tuple[Finding, ...]:
    """:func:`library_uses`, remembered: a test checks the same cells once per case, and
    walking every cell's tree again each time cost tenths of a second per notebook."""
    parsed = [(label, source, _parse(source)) for label, source in cells]
    around = [_parse(source) for _, source in context]
    aliases = _module_aliases(
        tree for tree in [*(t for _, _, t in parsed), *around] if tree is not None
    )
    found: list[Finding] = []

    def flag(label: str, source: str, node: ast.AST, what: str) -> None:
        line = getattr(node, "lineno", 0)
        found.append(Finding(label, line, what, _line_of(source, line)))

    def forbidden(module: str) -> bool:
        return _in(module, library) is not None and _in(module, allowed) is None

    for label, source, tree in parsed:
        if tree is None:
            error = parse_cell(source).error
            found.append(Finding(label, 0, f"cannot be read by the grader ({error})", ""))
            continue
        text_only = _docstrings(tree)
        # Attributes that are the object of a longer chain (``torch.nn`` in ``torch.nn.parallel``).
        inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if forbidden(alias.name):
                        flag(label, source, node, f"imports {alias.name}")
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                for alias in node.names:
                    if forbidden(module) or forbidden(f"{module}.{alias.name}"):
                        flag(label, source, node, f"imports {module}.{alias.name}")
            elif isinstance(node, ast.Attribute):
                dotted = _dotted(node)
                if dotted is None:
                    continue
                first, _, rest = dotted.partition(".")
                full = f"{aliases.get(first, first)}.{rest}" if rest else dotted
                if first in aliases and forbidden(full) and not forbidden(aliases[first]):
                    flag(label, source, node, f"uses {full}")
                elif first not in aliases and id(node) not in inner and forbidden(dotted):
                    # A module path spelled out whose first name only the notebook's locked
                    # cells import (``torch.nn.parallel.DistributedDataParallel`` or
                    # ``torch.optim.Adam`` after the setup's ``import torch``).
                    flag(label, source, node, f"uses {dotted}")
            elif isinstance(node, ast.Name) and node.id in DYNAMIC_CODE:
                flag(label, source, node, f"runs or imports code by name ({node.id})")
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                origin = aliases.get(node.id, "")
                if origin != node.id and forbidden(origin):
                    flag(label, source, node, f"uses {node.id}, imported from {origin}")
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in text_only
            ):
                named = [p for p in library if p in node.value and _in(p, allowed) is None]
                if named:
                    flag(label, source, node, f"names {named[0]} in a string")
    return tuple(_unique(found))


#: Names that reach the kernel or the interpreter without an import.
UNIMPORTED_REACH = {
    "get_ipython": GRADER_REACH["get_ipython"],
    "__builtins__": GRADER_REACH["__builtins__"],
    "exit": "exiting the interpreter",
    "quit": "exiting the interpreter",
    "exec": "running code from a string",
    "eval": "running code from a string",
    "compile": "running code from a string",
    "__import__": "importing a module chosen at run time",
}
Report = Callable[[ast.AST, str], None]


def reaches_into_grader(
    cells: Sequence[tuple[str, str]], protected: Iterable[str] = ()
) -> list[Finding]:
    """Places in ``cells`` that reach into the kernel or the grader (see the module docstring).

    ``protected`` names what the notebook's own (locked) cells define, such as the checks a
    test cell calls: binding one of them again is reported too.
    """
    protected = set(protected)
    parsed = [(label, source, _parse(source)) for label, source in cells]
    aliases = _module_aliases(tree for _, _, tree in parsed if tree is not None)
    found: list[Finding] = []
    for label, source, tree in parsed:
        if tree is None:  # IPython could not compile it either: none of it ran
            continue

        def flag(node: ast.AST, what: str, label: str = label, source: str = source) -> None:
            line = getattr(node, "lineno", 0)
            found.append(Finding(label, line, what, _line_of(source, line)))

        for node in ast.walk(tree):
            _scan_node(node, aliases, flag)
        for node in _module_level(tree):
            _scan_module_level(node, protected, flag)
        for magic in parse_cell(source).magics:
            if magic.shell:
                what = "running a shell command (!)"
            elif not magic.harmless:
                what = f"the IPython magic %{magic.name}, which the grader does not read"
            else:
                continue
            found.append(Finding(label, magic.line, what, _line_of(source, magic.line)))
    return _unique(found)


def _module_level(tree: ast.Module) -> list[ast.stmt]:
    """The statements that run at the top of a cell (inside if/for/with/try, not in defs)."""
    result: list[ast.stmt] = []
    todo = list(tree.body)
    while todo:
        node = todo.pop(0)
        result.append(node)
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    todo.append(child)
    return result


def _scan_module_level(node: ast.stmt, protected: set[str], flag: Report) -> None:
    """Report a cell binding again a name that the notebook's own cells define."""
    targets: list[ast.AST] = []
    if isinstance(node, ast.Assign | ast.Delete):
        targets = list(node.targets)
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        targets = [node.target]
    elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        if node.name in protected:
            flag(node, f"defines {node.name} again, a name of the notebook's own cells")
    while targets:
        target = targets.pop()
        if isinstance(target, ast.Tuple | ast.List | ast.Starred):
            targets.extend(target.elts if not isinstance(target, ast.Starred) else [target.value])
        elif isinstance(target, ast.Name) and target.id in protected:
            flag(target, f"binds {target.id} again, a name of the notebook's own cells")


def _scan_node(node: ast.AST, aliases: dict[str, str], flag: Report) -> None:
    if isinstance(node, ast.Import | ast.ImportFrom):
        for alias in node.names:
            module = alias.name if isinstance(node, ast.Import) else (node.module or "")
            full = module if isinstance(node, ast.Import) else f"{module}.{alias.name}"
            reason = _reach(full) or _reach(module)
            if reason:
                flag(node, reason)
    elif isinstance(node, ast.Name | ast.Attribute) and not isinstance(node.ctx, ast.Store):
        dotted = node.id if isinstance(node, ast.Name) else _dotted(node)
        if dotted is not None:
            first, _, rest = dotted.partition(".")
            if first in aliases:
                reason = _reach(f"{aliases[first]}.{rest}".rstrip("."))
            else:
                reason = UNIMPORTED_REACH.get(first)
            if reason:
                flag(node, reason)
        if isinstance(node, ast.Attribute) and node.attr in _TRANSFORMERS:
            flag(node, GRADER_REACH[node.attr])
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
        if OUTSIDE_PATH.match(node.value):
            flag(node, f"names a path outside the submission ({node.value[:60]})")
        elif VERDICT_LIKE.search(node.value):
            flag(node, f"text that imitates a grader's verdict ({node.value[:60]!r})")
    if isinstance(node, ast.Assign | ast.Delete):
        for target in node.targets:
            _patching(target, aliases, flag)
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        _patching(node.target, aliases, flag)
    elif isinstance(node, ast.ClassDef):
        methods = {
            item.name
            for item in node.body
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
            and item.name in FOOLING_METHODS
        }
        methods |= {
            target.id
            for item in node.body
            if isinstance(item, ast.Assign)
            for target in item.targets
            if isinstance(target, ast.Name) and target.id in FOOLING_METHODS
        }
        if methods:
            flag(node, f"a class that decides how its objects compare or convert ({min(methods)})")
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        if node.func.id in ("setattr", "delattr") and node.args:
            obj = _dotted(node.args[0])
            if obj and obj.split(".")[0] in aliases:
                flag(node, f"changes an attribute of {obj} ({node.func.id})")


_TRANSFORMERS = ("input_transformers_post", "input_transformers_cleanup", "ast_transformers")
#: Special methods with which an object decides how it compares or converts: a value made to
#: pass any comparison a check could make.
FOOLING_METHODS = frozenset(
    [
        "__eq__",
        "__ne__",
        "__lt__",
        "__le__",
        "__gt__",
        "__ge__",
        "__bool__",
        "__float__",
        "__int__",
        "__index__",
        "__abs__",
        "__array__",
        "__array_ufunc__",
        "__array_function__",
        "__array_interface__",
        "__torch_function__",
    ]
)


def _reach(dotted: str) -> str | None:
    """Why ``dotted`` (a module path with attributes) reaches into the grader, if it does."""
    parts = dotted.split(".")
    for size in range(len(parts), 0, -1):
        reason = GRADER_REACH.get(".".join(parts[:size]))
        if reason:
            return reason
    return None


def _patching(target: ast.AST, aliases: dict[str, str], flag: Report) -> None:
    """Report an assignment to an attribute (or item) of an imported module."""
    if isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            _patching(element, aliases, flag)
    elif isinstance(target, ast.Attribute | ast.Subscript):
        dotted = _dotted(target.value)
        if dotted and dotted.split(".")[0] in aliases:
            flag(target, f"changes {dotted}, an imported module")


def _unique(findings: list[Finding]) -> list[Finding]:
    seen: set[tuple[str, int, str]] = set()
    result = []
    for finding in findings:
        key = (finding.cell, finding.line, finding.what)
        if key not in seen:
            seen.add(key)
            result.append(finding)
    return result


def definitions(cells: Sequence[tuple[str, str]], name: str) -> list[tuple[str, ast.AST]]:
    """The statements of ``cells`` that bind ``name`` in a cell's own scope: ``(label,
    node)`` pairs, in the order of the cells."""
    found: list[tuple[str, ast.AST]] = []
    for label, source in cells:
        tree = _parse(source)
        if tree is not None:
            found += [(label, node) for node in bindings(tree)[1].get(name, [])]
    return found
