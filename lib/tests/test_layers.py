"""The library's folders are its layers: no module imports from a layer above its own.

The order, lowest first, is the package docstring's (and lib/README.md's): the engine, the
collectives (dist), parallelism, the cost models, judging, the course's tools, grading, the
classroom deployment. The
package's own ``__init__`` is the engine's front door. Every import statement counts, at the
top of a module or inside a function, under ``TYPE_CHECKING`` or not.
"""

import ast
from pathlib import Path

import chainrule
import pytest

LAYERS = ("engine", "dist", "parallel", "costs", "judging", "course", "grading", "classroom")
PACKAGE = Path(chainrule.__file__).parent


def layer_of(module: str) -> int:
    """The layer of a module of chainrule (``chainrule`` itself is the engine's)."""
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else 0


def imported(source: str, module: str) -> list[tuple[int, str]]:
    """``(line, module)`` for everything of chainrule that ``source`` (of ``module``) imports."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("chainrule")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package
                package = module.split(".")[: -node.level]
                base = ".".join([*package, *([base] if base else [])])
            if base == "chainrule":  # from chainrule import dist, Tensor
                found += [(node.lineno, f"chainrule.{a.name}") for a in node.names]
            elif base.startswith("chainrule."):
                found.append((node.lineno, base))
    return sorted(found)


def violations(source: str, module: str) -> list[str]:
    """The imports of ``source`` that reach a layer above ``module``'s."""
    own = layer_of(module)
    return [
        f"{module}:{line} imports {target} ({LAYERS[layer_of(target)]} is above {LAYERS[own]})"
        for line, target in imported(source, module)
        if layer_of(target) > own
    ]


def modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found.append((".".join(parts[:-1] if parts[-1] == "__init__" else parts), path))
    return found


def test_every_module_lives_in_a_layer():
    loose = [m for m, _ in modules() if m != "chainrule" and m.split(".")[1] not in LAYERS]
    assert loose == []


@pytest.mark.parametrize("layer", LAYERS)
def test_no_module_imports_from_a_layer_above_its_own(layer):
    found = [
        problem
        for module, path in modules()
        if layer_of(module) == LAYERS.index(layer)
        for problem in violations(path.read_text(), module)
    ]
    assert found == []


def test_an_import_from_above_is_found_wherever_it_stands():
    source = (
        "from chainrule import dist, Tensor\n"
        "from chainrule.engine import ops\n"
        "def f():\n"
        "    from chainrule.parallel import duality\n"
        "    import chainrule.course.checks\n"
        "    from ..costs import comm_cost\n"
    )
    assert violations(source, "chainrule.dist.api") == [
        "chainrule.dist.api:4 imports chainrule.parallel (parallel is above dist)",
        "chainrule.dist.api:5 imports chainrule.course.checks (course is above dist)",
        "chainrule.dist.api:6 imports chainrule.costs (costs is above dist)",
    ]
    assert violations(source, "chainrule.grading.batch") == []
