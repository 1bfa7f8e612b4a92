"""The package's structure: folders by concern, one-way imports, old paths that still work."""

import ast
import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from sizes import code_lines

import mxoid

PACKAGE = Path(mxoid.__file__).parent
# lazy: lazy_exports, used by the package root and by mxoid.distributed alike (a subpackage
# may not import the root, and the root should not import a concern's folder to build itself).
TOP_LEVEL = {
    "__init__",
    "__main__",
    "cli",
    "compat",
    "deferred_imports",  # beside compat: loaded by its path at start-up
    "distutils_version",  # beside compat: loaded by its path at start-up
    "errors",
    "inference",
    "launch",
    "lazy",
    "loss_scale",
    "operator_cache",  # beside compat: both loaded by their path at start-up
    "operator_file",  # operator_cache's file, loaded with it
    "precision",
    "schedules",
}
FOLDERS = {
    "checkpoint",
    "data",
    "distributed",
    "executor_manager",
    "export",
    "extensions",
    "log",
    "main_loop",
    "metrics",
    "network",
    "update",
}
LONGEST_FUNCTION = 100
LONGEST_MODULE = 350  # lines of code: documentation, comments and blank lines not counted


def module_name(path):
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports(path):
    """(runtime, type_only): the mxoid modules a file imports, resolved."""
    tree = ast.parse(path.read_text())
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    type_only_nodes = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
            type_only_nodes.update(id(inner) for inner in ast.walk(node))
    runtime, type_only = set(), set()
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        # A module's own packages are imported before it anyway: no edge.
        found = {
            t
            for t in targets
            if t.startswith("mxoid") and _is_module(t) and not name.startswith(t + ".")
        }
        (type_only if id(node) in type_only_nodes else runtime).update(found)
    return runtime - {name}, type_only - {name}


def _is_module(name):
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def graph():
    runtime, type_only = {}, {}
    for path in PACKAGE.rglob("*.py"):
        runtime[module_name(path)], type_only[module_name(path)] = imports(path)
    return runtime, type_only


def reaches(edges, start, goal):
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        if node == goal:
            return True
        if node not in seen:
            seen.add(node)
            todo.extend(edges.get(node, ()))
    return False


def test_the_top_level_holds_the_loop_and_one_folder_per_concern():
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert modules == TOP_LEVEL and folders == FOLDERS


def test_runtime_imports_have_no_circle():
    runtime, _ = graph()
    for module, targets in runtime.items():
        for target in targets:
            # A package importing its own submodules is how packages are made.
            if target.startswith(module + "."):
                continue
            assert not reaches(
                {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in runtime.items()},
                target,
                module,
            ), f"import circle: {module} -> {target} -> ... -> {module}"


def test_the_only_type_only_references_back_are_to_the_loop_or_within_a_folder():
    """From the Extension API to the loop, and from a folder's modules to its own classes."""
    runtime, type_only = graph()
    for module, targets in type_only.items():
        for target in targets:
            if reaches(runtime, target, module):
                from_extensions = (
                    module.startswith("mxoid.extensions.") and target == "mxoid.main_loop"
                )
                same_folder = module.rsplit(".", 1)[0] == target.rsplit(".", 1)[0] != "mxoid"
                assert from_extensions or same_folder, f"{module} refers back to {target}"


def test_the_loop_asks_extensions_only_through_the_extension_api():
    """No built-in extension has a privilege: the loop's folder imports only the API."""
    runtime, type_only = graph()
    for module in runtime:
        if module.startswith("mxoid.main_loop"):
            used = {
                t for t in runtime[module] | type_only[module] if t.startswith("mxoid.extensions")
            }
            assert used <= {"mxoid.extensions.base", "mxoid.extensions.dispatch"}, (
                f"{module} imports {sorted(used)}"
            )
    for path in (PACKAGE / "main_loop").glob("*.py"):
        assert "isinstance(" not in path.read_text() or not any(
            f"isinstance({name}, {cls})" in path.read_text()
            for name in ("e", "extension")
            for cls in ("Checkpoint", "TrainingMonitoring", "MetricsExtension", "Evaluate")
        ), path


def test_code_lines_leave_out_documentation_comments_and_blank_lines():
    text = (
        '"""A module.\n\nLong documentation.\n"""\n\n'
        "import os  # a comment\n\n"
        "# a comment line\n"
        'MESSAGE = (\n    "a message "\n    "on two lines"\n)\n'
        '"""The message\'s documentation."""\n\n\n'
        'def f():\n    """One line."""\n    return os.sep\n'
    )
    assert code_lines(text) == 7


def test_no_function_is_longer_than_100_lines_and_no_module_has_over_350_lines_of_code():
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        assert code_lines(text) <= LONGEST_MODULE, f"{path} has {code_lines(text)} lines of code"
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                assert length <= LONGEST_FUNCTION, f"{path}:{node.name} has {length} lines"


def test_no_subpackage_imports_the_package_root():
    """A folder's modules import what they use from its module, never from ``mxoid`` itself.

    The root imports the folders (lazily): a folder importing it back is a circle. The
    modules at the top (``mxoid.errors``, ``mxoid.lazy``...) may be imported; examples in
    docstrings (``from mxoid import Printing``) are documentation, not imports.
    """
    for path in sorted(PACKAGE.glob("*/**/*.py")):
        name = module_name(path)
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        tree = ast.parse(path.read_text())
        type_only = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test)
            for inner in ast.walk(node)
        }
        for node in ast.walk(tree):
            if id(node) in type_only:
                continue
            if isinstance(node, ast.Import):
                roots = [alias.name for alias in node.names if alias.name == "mxoid"]
                assert not roots, f"{path}:{node.lineno} imports the package root"
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                if base == "mxoid":
                    names = [a.name for a in node.names if not _is_module(f"mxoid.{a.name}")]
                    assert not names, f"{path}:{node.lineno} imports {names} from the package root"


def built_in_extensions():
    """The extension classes mxoid.extensions exports, besides the Extension API's own."""
    import mxoid.extensions as extensions

    classes = {getattr(extensions, name) for name in extensions.__all__}
    return {
        cls.__name__
        for cls in classes
        if isinstance(cls, type)
        and issubclass(cls, extensions.Extension)
        and cls is not extensions.Extension
    }


def test_no_module_checks_for_a_specific_built_in_extension():
    """What one part asks of an extension goes through the Extension API, never its type.

    Everywhere in mxoid, not only in the loop: an extension that needs another's
    information asks through the API (a record, an attribute of Extension), so a
    user's own extension can answer it as well.
    """
    names = built_in_extensions()
    assert {"Checkpoint", "FinishAfter", "Printing", "ProgressBar"} <= names
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("isinstance", "issubclass")
                and len(node.args) == 2
            ):
                continue
            classes = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            for cls in classes:
                cls_name = cls.attr if isinstance(cls, ast.Attribute) else getattr(cls, "id", None)
                if cls_name in names:
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {cls_name}")
    assert not found, found


def test_the_public_names_are_written_once_and_import():
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    checked = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom):
                    checked.update(alias.name for alias in inner.names)
    assert checked == set(mxoid.__all__) == set(mxoid._EXPORTS)
    for name in mxoid.__all__:
        assert getattr(mxoid, name) is not None


@pytest.mark.parametrize("old, new", sorted(mxoid.MOVED.items()))
def test_old_module_paths_still_import_with_a_warning_naming_the_new_one(old, new):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)


@pytest.mark.parametrize(
    "name, home",
    [
        ("check_contexts", "mxoid.executor_manager.devices"),
        ("forward_work_load", "mxoid.executor_manager.devices"),
        ("one_random_generator", "mxoid.executor_manager.devices"),
        ("split_batch", "mxoid.executor_manager.devices"),
        ("COUNTING_SUFFIX", "mxoid.executor_manager.private_heads"),
        ("RUNNING_SUMS_PREFIX", "mxoid.executor_manager.private_heads"),
        ("OutputArrays", "mxoid.executor_manager.outputs"),
        ("output_short_name", "mxoid.executor_manager.outputs"),
        ("DataParallelExecutorManager", "mxoid.executor_manager.manager"),
    ],
)
def test_names_that_left_the_executor_manager_module_still_import_from_it(name, home):
    from mxoid import executor_manager

    assert getattr(executor_manager, name) is getattr(importlib.import_module(home), name)


UPDATE_NAMES = [
    "KVStoreLike",
    "Update",
    "create_kvstore",
    "create_optimizer",
    "initialize_kvstore",
    "kvstore_keys",
    "local_update",
    "local_update_parts",
    "optimizer_settings",
    "prepare_update",
    "prepared_update_on_kvstore",
    "update_params",
    "update_params_on_kvstore",
]


@pytest.mark.parametrize("name", UPDATE_NAMES)
def test_the_update_functions_keep_their_names_under_mxoid_update(name):
    import mxoid.update

    assert name in mxoid.update.__all__ and getattr(mxoid.update, name) is not None


def test_the_loop_keeps_its_import_path():
    from mxoid.main_loop import MainLoop

    assert MainLoop is mxoid.MainLoop


def test_python_dash_m_mxoid_launch_still_runs():
    done = subprocess.run(
        [sys.executable, "-m", "mxoid.launch", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "--stall-timeout" in done.stdout
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from mxoid.launch import main  # noqa: F401  (no warning: a module of its own)


@pytest.mark.parametrize("module", ["mxoid.cli", "mxoid.distributed.launch", "mxoid.log"])
def test_the_command_and_the_launcher_start_without_loading_mxnet(module):
    code = f"import sys, {module}; print('mxnet' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr


# What names a kind of network: a Gluon block, a sym_gen's buckets, their traced or keyed graphs.
NETWORK_KINDS = {
    "BucketNetwork",
    "Buckets",
    "GluonNetwork",
    "HybridBlock",
    "SymbolBlock",
    "bucket_key",
    "buckets",
    "evaluation_symbol",
    "gluon",
    "is_block",
    "sym_gen",
}


def _code_names(path):
    """The names and attribute names a module's code uses (docstrings and comments aside)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            yield node.id, node.lineno
        elif isinstance(node, ast.Attribute):
            yield node.attr, node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module:
            parts = node.module.split(".")
            if "gluon" in parts and "data" not in parts:  # a DataLoader is data, not a network
                yield "gluon", node.lineno
            if parts[-1] in ("buckets", "gluon") and "network" in parts:
                yield parts[-1], node.lineno
            for alias in node.names:
                yield alias.name, node.lineno


def test_only_the_network_room_knows_the_kinds_of_network():
    """The loop, its extensions and inference ask ``loop.network``; none asks which kind it is."""
    paths = [*(PACKAGE / "main_loop").glob("*.py"), *(PACKAGE / "extensions").glob("*.py")]
    for path in [*paths, PACKAGE / "inference.py"]:
        found = sorted(
            {f"{name} (line {line})" for name, line in _code_names(path) if name in NETWORK_KINDS}
        )
        assert not found, f"{path.relative_to(PACKAGE)} refers to a kind of network: {found}"


def test_the_network_room_holds_the_three_kinds_behind_one_seam():
    from mxoid.network import BucketNetwork, GluonNetwork, Network

    assert issubclass(BucketNetwork, Network) and issubclass(GluonNetwork, Network)
    for name in ("graph", "forward_set", "training_set", "key_of", "give_back", "checkpoint_files"):
        assert callable(getattr(Network, name)), name


def test_the_loop_has_no_mixin_and_no_sibling_module_touches_its_private_attributes():
    from mxoid import MainLoop

    assert MainLoop.__bases__ == (object,)
    for path in [*(PACKAGE / "main_loop").glob("*.py"), *(PACKAGE / "extensions").glob("*.py")]:
        if path.name == "loop.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and isinstance(node.value, (ast.Name, ast.Attribute))
                and (getattr(node.value, "id", None) or getattr(node.value, "attr", None))
                in ("loop", "main_loop")
            ):
                raise AssertionError(f"{path.name}:{node.lineno} reads the loop's {node.attr}")
