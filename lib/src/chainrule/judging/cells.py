"""How the course reads the source of a notebook cell: as IPython runs it.

A code cell is not plain Python: it may hold line magics (``%time f(x)``), cell magics
(``%%capture``), shell escapes (``!ls``) and help requests (``f?``). IPython turns every one of
them into Python (``get_ipython().run_line_magic('time', 'f(x)')``) before it compiles the cell,
with :class:`IPython.core.inputtransformer2.TransformerManager`. :func:`parse_cell` does the
same, so that whatever reads a cell (the source scan of the grader, the restart hint) reads
the code that runs and nothing else. The code a magic runs itself (``%time``, ``%timeit``,
``%prun``, ``%%time``, ``%%capture``) is parsed in turn and put where the magic stood, with
its line numbers; every other magic and every shell command is recorded as a :class:`Magic`.

:func:`bound_names` is the one reading of which names a cell binds at its top level.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass, field

#: Magics that run Python code given to them: (line magic or cell magic) → options that take
#: a value (``-n 3``), so that the code can be found after them.
CODE_MAGICS: dict[str, frozenset[str]] = {
    "time": frozenset(),
    "timeit": frozenset("nrpv"),
    "prun": frozenset("DlsT"),
    "capture": frozenset(),
}
#: Magics that run no code of the cell and reach nothing: a cell may use them freely.
HARMLESS_MAGICS = frozenset(["matplotlib", "precision", "pprint", "pinfo", "pinfo2", "pdoc"])
#: Calls IPython's transformation writes for shell escapes (``!cmd``, ``x = !cmd``).
SHELL_CALLS = frozenset(["system", "getoutput"])


@dataclass(frozen=True)
class Magic:
    """A magic or shell escape of a cell: its name (``system`` for ``!``), the line it is on,
    and its argument text."""

    name: str
    line: int
    argument: str

    @property
    def shell(self) -> bool:
        """Whether it runs a shell command."""
        return self.name in SHELL_CALLS

    @property
    def harmless(self) -> bool:
        """Whether it runs no code a reader would have to see (``%matplotlib inline``)."""
        return self.name in HARMLESS_MAGICS or self.name in CODE_MAGICS


@dataclass
class ParsedCell:
    """A cell read as IPython runs it: its syntax tree (``None`` if it does not parse, with
    ``error`` saying why), and its magics and shell escapes."""

    tree: ast.Module | None
    error: str = ""
    magics: list[Magic] = field(default_factory=list)


@functools.lru_cache(maxsize=1)
def _transformer() -> object:
    from IPython.core.inputtransformer2 import TransformerManager

    return TransformerManager()


def python_source(source: str) -> str:
    """The Python IPython compiles for a cell's ``source`` (magics turned into calls)."""
    return str(_transformer().transform_cell(source))  # type: ignore[attr-defined]


def _magic_call(node: ast.AST) -> tuple[str, list[str]] | None:
    """``(method, [string arguments])`` for ``get_ipython().<method>('...', ...)``."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return None
    owner = node.func.value
    if not (
        isinstance(owner, ast.Call)
        and isinstance(owner.func, ast.Name)
        and owner.func.id == "get_ipython"
        and not owner.args
    ):
        return None
    texts = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    if len(texts) != len(node.args):
        return None
    return node.func.attr, texts


def _code_of(name: str, line: str) -> str:
    """The code after a code-running magic's options (``-n 3 -r1 f(x)`` → ``f(x)``)."""
    words = line.split()
    valued = CODE_MAGICS.get(name, frozenset())
    while words and words[0].startswith("-") and len(words[0]) > 1:
        option = words.pop(0)
        if option[1:] in valued and words:  # "-n 3": the value is the next word
            words.pop(0)
    return " ".join(words)


class _Inliner(ast.NodeTransformer):
    """Replace each magic call by the code it runs (or ``pass``), recording the magics."""

    def __init__(self) -> None:
        self.magics: list[Magic] = []
        self.errors: list[str] = []

    def _parsed(self, code: str, line: int) -> list[ast.stmt]:
        try:
            tree = ast.parse(code)
        except (SyntaxError, ValueError) as error:
            self.errors.append(f"line {line}: the code of a magic does not parse ({error})")
            return []
        ast.increment_lineno(tree, line - 1)
        return [self.visit(statement) for statement in tree.body]

    def _expand(self, node: ast.AST) -> list[ast.stmt] | None:
        call = _magic_call(node)
        if call is None:
            return None
        method, texts = call
        line = getattr(node, "lineno", 0)
        if method in SHELL_CALLS:
            self.magics.append(Magic(method, line, texts[0] if texts else ""))
            return []
        if method == "run_line_magic" and len(texts) == 2:
            name, argument = texts
            self.magics.append(Magic(name, line, argument))
            return self._parsed(_code_of(name, argument), line) if name in CODE_MAGICS else []
        if method == "run_cell_magic" and len(texts) == 3:
            name, argument, body = texts
            self.magics.append(Magic(name, line, argument))
            if name not in CODE_MAGICS:
                return []
            statements = self._parsed(body, line + 1)
            target = argument.split()[0] if name == "capture" and argument.split() else None
            if target and target.isidentifier() and not target.startswith("-"):
                store = ast.Assign([ast.Name(target, ast.Store())], ast.Constant(None))
                statements.insert(0, ast.copy_location(store, node))
            return statements
        self.magics.append(Magic(method, line, " ".join(texts)))
        return []

    def generic_visit(self, node: ast.AST) -> ast.AST:
        for name, value in ast.iter_fields(node):
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                body: list[ast.stmt] = []
                for statement in value:
                    expanded = None
                    if isinstance(statement, ast.Expr):
                        expanded = self._expand(statement.value)
                    elif isinstance(statement, ast.Assign):  # x = !ls
                        if self._expand(statement.value) is not None:
                            statement.value = ast.copy_location(ast.Constant(None), statement)
                    if expanded is None:
                        body.append(self.visit(statement))
                    else:
                        body.extend(expanded)
                if not body:
                    body = [ast.Pass(lineno=getattr(node, "lineno", 1), col_offset=0)]
                setattr(node, name, body)
            elif isinstance(value, list):
                setattr(node, name, [self.visit(v) if isinstance(v, ast.AST) else v for v in value])
            elif isinstance(value, ast.AST):
                setattr(node, name, self.visit(value))
        return node


@functools.lru_cache(maxsize=512)
def parse_cell(source: str) -> ParsedCell:
    """Read a code cell as IPython runs it (see the module docstring). The result is shared
    between callers with the same source: read it, do not change it."""
    try:
        tree = ast.parse(python_source(source))
    except (SyntaxError, ValueError) as error:
        return ParsedCell(None, f"{type(error).__name__}: {error}")
    inliner = _Inliner()
    tree = inliner.visit(tree)
    ast.fix_missing_locations(tree)
    return ParsedCell(tree, "; ".join(inliner.errors), inliner.magics)


# -- the names a cell binds ------------------------------------------------------------------


class _TopLevelBindings(ast.NodeVisitor):
    """Names bound in a cell's own (global) scope, with the kind of statement binding them.

    Function, class and lambda bodies and comprehensions have scopes of their own, so the
    visitor records a ``def``/``class`` name but does not look inside.
    """

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.nodes: dict[str, list[ast.stmt]] = {}
        self._statement: ast.stmt | None = None

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.stmt):
            outer, self._statement = self._statement, node
            super().visit(node)
            self._statement = outer
        else:
            super().visit(node)

    def _bind(self, name: str, kind: str) -> None:
        self.names.setdefault(name, kind)
        if self._statement is not None:
            self.nodes.setdefault(name, []).append(self._statement)

    def _bind_targets(self, target: ast.AST, kind: str) -> None:
        for node in ast.walk(target):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                self._bind(node.id, kind)

    def visit_Assign(self, node: ast.Assign) -> None:  # noqa: N802 - ast's naming
        for target in node.targets:
            self._bind_targets(target, "assignment")
        self.visit(node.value)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:  # noqa: N802
        if node.value is not None:
            self._bind_targets(node.target, "assignment")
            self.visit(node.value)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:  # noqa: N802
        self._bind_targets(node.target, "assignment")
        self.visit(node.value)

    def visit_For(self, node: ast.For | ast.AsyncFor) -> None:  # noqa: N802
        self._bind_targets(node.target, "for loop")
        self.generic_visit(node)

    visit_AsyncFor = visit_For  # noqa: N815

    def visit_withitem(self, node: ast.withitem) -> None:
        if node.optional_vars is not None:
            self._bind_targets(node.optional_vars, "with statement")
        self.visit(node.context_expr)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:  # noqa: N802
        if node.name:
            self._bind(node.name, "except clause")
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import | ast.ImportFrom) -> None:  # noqa: N802
        for alias in node.names:
            if alias.name != "*":
                self._bind(alias.asname or alias.name.split(".")[0], "import")

    visit_ImportFrom = visit_Import  # noqa: N815

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:  # noqa: N802
        self._bind(node.name, "def")

    visit_AsyncFunctionDef = visit_FunctionDef  # noqa: N815

    def visit_ClassDef(self, node: ast.ClassDef) -> None:  # noqa: N802
        self._bind(node.name, "class")

    def visit_Lambda(self, node: ast.Lambda) -> None:  # noqa: N802
        return None

    def _skip_scope(self, node: ast.AST) -> None:
        return None

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _skip_scope  # noqa: N815


def bindings(tree: ast.Module) -> tuple[dict[str, str], dict[str, list[ast.stmt]]]:
    """The names ``tree`` binds at top level: ``{name: kind}`` and ``{name: [statements]}``
    (the innermost statement of each binding, in the order of the cell)."""
    visitor = _TopLevelBindings()
    visitor.visit(tree)
    return visitor.names, visitor.nodes


def bound_names(source: str) -> dict[str, str]:
    """The names a code cell binds at top level, each with its kind of statement.

    ``{"model": "assignment", "np": "import", "train": "def"}``; a cell that does not parse
    binds nothing.
    """
    parsed = parse_cell(source)
    return {} if parsed.tree is None else bindings(parsed.tree)[0]
