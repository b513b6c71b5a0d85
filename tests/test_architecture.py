"""docs/architecture.md's Architecture section is the layering, and the code keeps it: the library is one package per
stage, each package a layer; every minigpt module is listed once, under its own package, and no module imports a
module of a package listed after its own (the stage scripts sit on top of them all)."""

import ast
import re

from helpers import REPO_ROOT
from minigpt.core.code_binding import run_code_files

PACKAGE = REPO_ROOT / "minigpt"


def readme_layers() -> dict[str, int]:
    """module path -> layer number, from docs/architecture.md's '## Architecture' section ('### N. `minigpt/pkg/` …'
    headings, the package's modules listed under them)."""
    text = (REPO_ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("\n## Architecture\n", 1)[1].split("\n## ", 1)[0]
    layers, layer, package = {}, None, None
    for line in section.splitlines():
        heading = re.match(r"### (\d+)\. `(minigpt/\w+/)`", line)
        if heading:
            layer, package = int(heading.group(1)), heading.group(2)
        elif line.startswith("- ") and layer is not None:
            for name in re.findall(r"`(minigpt/[\w/]+\.py)`", line.split(" — ", 1)[0]):
                assert name not in layers, f"{name} is listed twice in docs/architecture.md's Architecture section"
                assert name.startswith(package), f"{name} is listed under {package}, which does not hold it"
                layers[name] = layer
    return layers


def minigpt_imports(path) -> set[str]:
    """The minigpt modules a file imports (as minigpt/…py paths), at any depth of the file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] != "minigpt":
                continue
            for candidate in ("/".join(parts) + ".py", "/".join(parts) + "/__init__.py"):
                if (REPO_ROOT / candidate).is_file():
                    found.add(candidate)
    return found


def modules() -> list[str]:
    return sorted(str(p.relative_to(REPO_ROOT)) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py")


def test_the_library_is_packages_only():
    """Every module lives in a stage's package (or the core): nothing loose at minigpt/'s top level."""
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == ["__init__.py"]
    assert all(len(REPO_ROOT.joinpath(name).relative_to(PACKAGE).parts) == 2 for name in modules())


def test_every_module_is_in_exactly_one_layer_of_the_readme():
    layers = readme_layers()
    assert set(modules()) - set(layers) == set(), "modules missing from docs/architecture.md's Architecture section"
    assert set(layers) - set(modules()) == set(), "docs/architecture.md lists modules that do not exist"


def test_no_module_imports_a_module_above_it():
    layers = readme_layers()
    upward = [f"{name} (layer {layers[name]}) imports {dep} (layer {layers[dep]})"
              for name in modules() for dep in sorted(minigpt_imports(REPO_ROOT / name))
              if dep in layers and layers[dep] > layers[name]]
    assert upward == []


def test_the_layering_check_sees_an_upward_import(tmp_path):
    layers = readme_layers()
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from minigpt.train.loop import train\n")
    assert "minigpt/train/loop.py" in minigpt_imports(probe)
    assert layers["minigpt/train/loop.py"] > layers["minigpt/model/gpt.py"]


def lr_writers(path) -> bool:
    """Whether the file assigns something["lr"] (an optimizer group's learning rate)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Assign):
            targets = node.targets
        else:
            targets = [node.target] if isinstance(node, ast.AugAssign) else []
        for target in targets:
            if isinstance(target, ast.Subscript) and isinstance(target.slice,
                                                                ast.Constant) and target.slice.value == "lr":
                return True
    return False


def test_the_lr_is_computed_and_applied_in_one_module():
    """train.lr reaches the optimizer through minigpt/train/train_step.py alone: nothing else writes a group's LR
    or calls the schedule's formula (the bugs minigpt/testing/ plants on purpose aside: no run imports them)."""
    writers = [name for name in modules() if not name.startswith("minigpt/testing/") and lr_writers(REPO_ROOT / name)]
    assert writers == ["minigpt/train/train_step.py"]
    formula = [name for name in modules() if name != "minigpt/train/train_step.py"
               and re.search(r"\bcosine_with_warmup\(", (REPO_ROOT / name).read_text(encoding="utf-8"))]
    assert formula == []


def test_the_lr_check_sees_a_second_writer(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f(opt):\n    for g in opt.param_groups:\n        g['lr'] = 0.1\n")
    assert lr_writers(probe)


BENCHMARKS = REPO_ROOT / "benchmarks"
SHARED_BENCHMARK_MODULES = {"bench_common", "__init__"}


def imported_top_names(path) -> set[str]:
    """The top-level names a file imports ("bench_common", "benchmarks", "minigpt", …), at any depth of the file."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return {name.split(".")[0] for name in names} | {name for name in names if name.startswith("benchmarks.")}


def benchmark_scripts() -> set[str]:
    return {p.stem for p in BENCHMARKS.glob("*.py")} - SHARED_BENCHMARK_MODULES


def scripts_imported(path) -> set[str]:
    scripts = benchmark_scripts()
    return {name for name in imported_top_names(path)
            if name in scripts or (name.startswith("benchmarks.") and name.split(".")[1] in scripts)}


def test_no_benchmark_script_imports_another_and_tests_import_no_benchmark():
    """What two benchmark scripts share is in benchmarks/bench_common.py; what the tests and the benchmarks share is
    in minigpt/testing/ (the fixture corpus, the planted bugs): tests run a benchmark as a command, never import it."""
    crossing = {p.name: sorted(scripts_imported(p)) for p in BENCHMARKS.glob("*.py") if scripts_imported(p)}
    assert crossing == {}
    into_benchmarks = {str(p.relative_to(REPO_ROOT)): sorted(n for n in imported_top_names(p)
                                                           if n in ("benchmarks", "bench_common") or n in
                                                           benchmark_scripts() or n.startswith("benchmarks."))
                       for p in (REPO_ROOT / "tests").rglob("*.py")}
    assert {name: found for name, found in into_benchmarks.items() if found} == {}
    assert [name for name in run_code_files(REPO_ROOT) if name.startswith("minigpt/testing/")] == [], "no run code"


def test_the_benchmark_import_check_sees_a_script_importing_another(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from compile_step import VOCAB\n    import benchmarks.tables\n")
    assert scripts_imported(probe) == {"compile_step", "benchmarks.tables"}
    probe.write_text("from bench_common import VOCAB\nfrom minigpt.testing import planted_bugs\n")
    assert scripts_imported(probe) == set()
