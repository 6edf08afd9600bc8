"""The import arrows of the layout (docs: fastloader/ is the front door both backends share).

- fastloader/ never imports a backend: the factory's BACKENDS table, which names them as strings
  and loads the chosen one with importlib, is the one documented exception;
- dali_loader/ and torch_loader/ never import each other;
- inside the three packages, a name is imported from the module that defines it (a schema type
  from schema.py, not through config.py), and no private name crosses modules;
- no import circle anywhere in the packages, and no import that runs up a floor (FLOORS, the
  layers docs/architecture.md draws): imports inside functions and under TYPE_CHECKING count too;
- no class sets more than 12 `self.` attributes or defines more than 25 methods (issue 71).

Each rule is read from the source with `ast`, so a violation fails here before it runs anywhere.
"""
from __future__ import annotations

import ast
import fnmatch
import re
import textwrap
from pathlib import Path

from conftest import REPO

PACKAGES = ("fastloader", "dali_loader", "torch_loader")
BACKENDS = ("dali_loader", "torch_loader")
BY_NAME = "fastloader.factory"
"""The one module of fastloader that may name a backend (as strings in its BACKENDS table)."""
BACKEND_NAME = re.compile(r"(dali_loader|torch_loader)(\.\w+)*")


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the packages under root."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports(name: str, path: Path) -> list[tuple[int, str, str | None]]:
    """(line, imported module, imported name or None) of every import in the module, relative
    imports resolved; `from package import module` yields the module too."""
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                found.append((node.lineno, module, alias.name))
    return found


def defined_names(path: Path) -> set[str]:
    """Names a module defines at its top level (functions, classes, assignments), not those it imports."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


FLOORS = (
    ("basics", ("fastloader.errors", "fastloader.interfaces", "fastloader.words", "fastloader.units",
                "fastloader.yaml_text", "fastloader.paths", "fastloader.machine", "fastloader.progress",
                "fastloader.stats", "fastloader.parallel", "fastloader.transfer", "fastloader.config_words",
                "fastloader.order", "fastloader.read_ahead", "fastloader.dotted", "fastloader.locations",
                "fastloader.exits", "fastloader.distributed", "fastloader.augment", "fastloader.augment.*",
                "fastloader.cuda_libraries", "fastloader.cuda_install",
                "fastloader.imaging", "fastloader.imaging.*")),
    ("config", ("fastloader.schema", "fastloader.samples", "fastloader.cache_format", "fastloader.config_dump",
                "fastloader.demo", "fastloader.bad_input", "fastloader.resolution",
                "fastloader.mixing", "fastloader.device_ops", "fastloader.draws", "fastloader.hooks",
                "fastloader.views")),
    ("sources", ("fastloader.sources", "fastloader.sources.*")),
    ("decoding", ("fastloader.decoding", "fastloader.decoding.*")),
    ("preparation", ("fastloader.config*", "fastloader.weights", "fastloader.blocks", "fastloader.screening",
                     "fastloader.cache", "fastloader.cache_write", "fastloader.prepared", "fastloader.packing")),
    ("loader", ("fastloader.loader_setup", "fastloader.epoch_cursor", "fastloader.skipped_files",
                "fastloader.shard_fetches", "fastloader.loader_state", "fastloader.loader_words",
                "fastloader.contract", "fastloader.factory", "fastloader")),
    ("front", ("fastloader.cli", "fastloader.commands", "fastloader.commands.*", "fastloader.lightning",
               "fastloader.timm", "dali_loader", "dali_loader.*", "torch_loader", "torch_loader.*")),
)
"""The floors of the packages, from the bottom up: a module imports from its own floor or below.
A module is on the first floor (from the bottom) that names it, or matches it."""


def floor_of(module: str) -> int | None:
    """The number of the floor a module is on (FLOORS), None where no floor names it."""
    return next((number for number, (_, patterns) in enumerate(FLOORS)
                 if any(fnmatch.fnmatchcase(module, pattern) for pattern in patterns)), None)


def import_graph(root: Path) -> dict[str, dict[str, int]]:
    """Module -> {module it imports: the line of the first such import}, every import counted."""
    known = modules(root)
    graph = {}
    for name, path in known.items():
        edges: dict[str, int] = {}
        for line, module, imported in imports(name, path):
            target = f"{module}.{imported}" if imported and f"{module}.{imported}" in known else module
            if target in known and target != name:
                edges.setdefault(target, line)
        graph[name] = edges
    return graph


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The import circles: each strongly connected set of two or more modules, sorted (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in graph[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            members = []
            while True:
                member = stack.pop()
                members.append(member)
                if member == module:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    for module in graph:
        if module not in index:
            visit(module)
    return sorted(found)


def climbs(root: Path) -> list[str]:
    """Every module on no floor, and every import that runs up a floor, as 'file:line: what'."""
    known = modules(root)
    found = [f"{known[name].relative_to(root)}: on no floor of FLOORS" for name in known if floor_of(name) is None]
    for name, edges in import_graph(root).items():
        for target, line in edges.items():
            if None not in (floor_of(name), floor_of(target)) and floor_of(target) > floor_of(name):
                found.append(f"{known[name].relative_to(root)}:{line}: {name} ({FLOORS[floor_of(name)][0]}) imports "
                             f"{target}, a floor up ({FLOORS[floor_of(target)][0]})")
    return found


def room_of(module: str) -> str:
    """The room a module is in: its folder (a package below the top one: fastloader.sources, a backend),
    or itself (a module of fastloader's own folder, or the package)."""
    parts = module.split(".")
    if parts[0] in BACKENDS:
        return parts[0]
    return ".".join(parts[:2])


def room_graph(graph: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """The import graph with each folder as one room: room -> {room it imports: 0}."""
    rooms: dict[str, dict[str, int]] = {}
    for module, edges in graph.items():
        here = rooms.setdefault(room_of(module), {})
        for target in edges:
            if room_of(target) != room_of(module):
                here[room_of(target)] = 0
                rooms.setdefault(room_of(target), {})
    return rooms


def split_rooms(root: Path) -> list[str]:
    """Each room (folder) whose modules stand on more than one floor: its floors, by module."""
    floors: dict[str, set[str]] = {}
    for module in modules(root):
        if floor_of(module) is not None:
            floors.setdefault(room_of(module), set()).add(FLOORS[floor_of(module)][0])
    return sorted(f"{room}: {sorted(names)}" for room, names in floors.items() if len(names) > 1)


def top(module: str) -> str:
    return module.split(".")[0]


def violations(root: Path) -> list[str]:
    """Every break of the layout's rules in the packages under root, as 'file:line: what'."""
    found = []
    known = modules(root)
    for name, path in known.items():
        where = path.relative_to(root)
        for line, module, imported in imports(name, path):
            target = f"{module}.{imported}" if imported and f"{module}.{imported}" in known else module
            if top(name) == "fastloader" and top(target) in BACKENDS:
                found.append(f"{where}:{line}: fastloader imports the backend module {target}")
            if top(name) in BACKENDS and top(target) in BACKENDS and top(target) != top(name):
                found.append(f"{where}:{line}: the {top(name)} backend imports the other backend, {target}")
            if target != module or module not in known or imported in (None, "*"):
                continue
            if imported.startswith("_") and not imported.startswith("__"):
                found.append(f"{where}:{line}: imports the private name {imported} from {module}")
            elif imported not in defined_names(known[module]):
                found.append(f"{where}:{line}: imports {imported} through {module}, which does not define it; "
                             f"import it from the module that does")
        if top(name) == "fastloader" and name != BY_NAME:
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                        and BACKEND_NAME.fullmatch(node.value):
                    found.append(f"{where}:{node.lineno}: names the backend module {node.value!r}; only "
                                 f"{BY_NAME} loads backends by name")
    return found


def test_the_packages_follow_the_layout():
    assert violations(REPO) == []


CONFIG_READERS = (
    "fastloader", "fastloader.config", "fastloader.config_build", "fastloader.config_rules", "fastloader.config_dump",
    "fastloader.factory", "fastloader.prepared", "fastloader.contract",  # the one pass, and the shared loader
    "fastloader.loader_setup",
    "fastloader.blocks", "fastloader.weights", "fastloader.resolution", "fastloader.draws", "fastloader.views",
    "fastloader.device_ops", "fastloader.mixing",  # each turns its keys into a plan (prepared.plan_batches)
    "fastloader.sources.formats", "fastloader.sources.registry", "fastloader.sources.folder",
    "fastloader.sources.webdataset", "fastloader.sources.parquet", "fastloader.sources.arrow_file",
    "fastloader.sources.hf_columns", "fastloader.sources.multi",
    "fastloader.sources.user_source",  # a format reads its own keys
    "fastloader.cache", "fastloader.cache_write", "fastloader.packing", "fastloader.commands.check",
    "dali_loader.loader", "torch_loader.loader")  # in a backend only its loader: its graph, transforms take values
"""The modules that take the config (a dataclass of schema.py) and turn it into values: the config
floor, the one pass of preparation and the plans it makes, the formats, the caches, and each
backend's loader. Every other module is handed values (screening, the ranks, the hooks, the stores,
bad-input handling, a backend's graph, transforms and normalizer), so that a change of a key's
meaning is made where the key is read."""


def config_readers(root: Path) -> set[str]:
    """The modules that import one of schema.py's dataclasses (the Config or a section of it)."""
    schema = ast.parse((root / "fastloader" / "schema.py").read_text())
    types = {node.name for node in schema.body if isinstance(node, ast.ClassDef)
             and any("dataclass" in ast.unparse(decorator) for decorator in node.decorator_list)}
    return {name for name, path in modules(root).items()
            if any(module in ("fastloader.schema", "fastloader.config") and imported in types
                   for _, module, imported in imports(name, path))}


def test_only_the_planners_and_each_backends_loader_take_the_config():
    assert sorted(config_readers(REPO)) == sorted(CONFIG_READERS)


def test_a_module_that_takes_the_config_is_found(tmp_path):
    (tmp_path / "fastloader").mkdir()
    (tmp_path / "fastloader" / "schema.py").write_text("from dataclasses import dataclass\n@dataclass\n"
                                                       "class SplitConfig:\n    name: str\nLIMIT = 3\n")
    (tmp_path / "fastloader" / "screening.py").write_text("from .schema import SplitConfig\n")
    (tmp_path / "fastloader" / "decoding.py").write_text("from .schema import LIMIT\n")
    for package in BACKENDS:
        (tmp_path / package).mkdir()
    assert config_readers(tmp_path) == {"fastloader.screening"}  # a constant of schema's is no config


def test_no_import_runs_in_a_circle_nor_up_a_floor():
    assert circles(import_graph(REPO)) == []
    assert climbs(REPO) == []


def test_each_folder_is_one_room_on_one_floor_and_no_rooms_import_in_a_circle():
    """With each folder (sources/, decoding/, a backend) counted as one room: every room stands on one
    floor, so no arrow runs up a floor between rooms either, and no rooms import each other in a
    circle (a leaf kept in a higher folder, as locations.py once was in sources/, makes one)."""
    assert split_rooms(REPO) == []
    assert circles(room_graph(import_graph(REPO))) == []


def test_rooms_catch_a_circle_that_modules_alone_do_not(tmp_path):
    write_package(tmp_path, {
        "fastloader/__init__.py": "",
        "fastloader/samples.py": "from .sources.locations import Location\n",
        "fastloader/sources/__init__.py": "",
        "fastloader/sources/locations.py": "class Location: ...\n",
        "fastloader/sources/folder.py": "from ..samples import Location\n",
    })
    graph = import_graph(tmp_path)
    assert circles(graph) == []
    assert circles(room_graph(graph)) == [["fastloader.samples", "fastloader.sources"]]


def test_the_architecture_page_draws_the_floors_of_this_table():
    """docs/architecture.md's floor block names the floors of FLOORS, bottom last, each with the same
    modules (a module moved a floor without the page following fails here)."""
    page = (REPO / "docs" / "architecture.md").read_text()
    block = page[page.index("## The import arrows"):].split("```")[1]
    drawn: list[tuple[str, set[str]]] = []
    for line in re.sub(r"\([^)]*\)", "", block).splitlines():  # asides in brackets, over lines too
        text = line.strip()
        if not text or text == "^":
            continue
        if not line[:1].isspace():
            name, _, text = text.partition(" ")
            drawn.append((name, set()))
        drawn[-1][1].update(_pattern(entry.strip()) for entry in text.split(",") if entry.strip())
    assert drawn[::-1] == [(name, set(patterns)) for name, patterns in FLOORS]


def _pattern(entry: str) -> str:
    """A module as the page writes it (schema, sources/*, dali_loader/*) as FLOORS writes it."""
    dotted = entry.replace("/", ".")
    return dotted if dotted.split(".")[0] in (*BACKENDS, "fastloader") else f"fastloader.{dotted}"


def test_a_circle_and_a_climb_are_caught_where_imports_hide(tmp_path):
    """An import inside a function or under TYPE_CHECKING counts like one at the top."""
    write_package(tmp_path, {
        "fastloader/__init__.py": "",
        "fastloader/errors.py": "def hint():\n    from .schema import Config\n",
        "fastloader/schema.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .errors import hint\n"
                                "class Config: ...\n",
        "fastloader/orphan.py": "",
    })
    assert circles(import_graph(tmp_path)) == [["fastloader.errors", "fastloader.schema"]]
    assert climbs(tmp_path) == ["fastloader/orphan.py: on no floor of FLOORS",
                                "fastloader/errors.py:2: fastloader.errors (basics) imports fastloader.schema, a floor "
                                "up (config)"]


def test_the_factory_loads_each_backend_by_name_from_one_table():
    from fastloader.factory import BACKENDS as table
    assert sorted(top(module) for module, _ in table.values()) == sorted(BACKENDS)
    assert "import_module" in (REPO / "fastloader" / "factory.py").read_text()


def write_package(root: Path, files: dict[str, str]) -> None:
    for relpath, text in files.items():
        path = root / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_each_kind_of_violation_is_caught(tmp_path):
    """The rules on a small tree that breaks each of them once (and keeps them elsewhere)."""
    write_package(tmp_path, {
        "fastloader/__init__.py": "",
        "fastloader/schema.py": "class Config: ...\n_SECTIONS = {}\n",
        "fastloader/config.py": "from .schema import Config\ndef load_config(): ...\n",
        "fastloader/factory.py": "BACKENDS = {'torch': ('torch_loader.loader', 'TorchLoader')}\n",
        "fastloader/sneaky.py": """\
            import importlib
            from .schema import Config, _SECTIONS
            from .config import Config as Again, load_config
            from torch_loader.loader import TorchLoader
            LOADER = importlib.import_module("dali_loader.loader")
            """,
        "fastloader/imaging/__init__.py": "",
        "fastloader/decoding/screen.py": "from .. import schema\nfrom ..schema import Config\n",
        "torch_loader/__init__.py": "",
        "torch_loader/loader.py": "from fastloader.config import load_config\nclass TorchLoader: ...\n",
        "dali_loader/__init__.py": "",
        "dali_loader/loader.py": "from torch_loader import loader\nfrom fastloader import factory\n",
    })
    assert sorted(violations(tmp_path)) == sorted([
        "dali_loader/loader.py:1: the dali_loader backend imports the other backend, torch_loader.loader",
        "fastloader/sneaky.py:2: imports the private name _SECTIONS from fastloader.schema",
        "fastloader/sneaky.py:3: imports Config through fastloader.config, which does not define it; "
        "import it from the module that does",
        "fastloader/sneaky.py:4: fastloader imports the backend module torch_loader.loader",
        "fastloader/sneaky.py:5: names the backend module 'dali_loader.loader'; only fastloader.factory loads "
        "backends by name",
    ])


def test_the_architecture_page_lists_every_module_and_no_other():
    """docs/architecture.md's layout block names each module once; a module added, moved or
    removed without the page following fails here."""
    page = (REPO / "docs" / "architecture.md").read_text()
    block = page[page.index("## Layout"):].split("```")[1]
    package_files = {path.relative_to(REPO).as_posix() for package in PACKAGES
                     for path in (REPO / package).rglob("*.py") if path.name != "__init__.py"}
    missing = sorted(path for path in package_files if Path(path).name not in block)
    assert not missing, f"docs/architecture.md's layout does not list: {missing}"
    named = set(re.findall(r"\b(\w+\.py)\b", block))
    existing = {path.name for path in REPO.rglob("*.py") if ".venv" not in path.parts}
    assert not named - existing, f"docs/architecture.md names modules that do not exist: {sorted(named - existing)}"


MAX_ATTRIBUTES, MAX_METHODS = 12, 25
"""Issue 71's bar for a class a newcomer can hold in mind: the `self.` attributes it sets, the
methods it defines (properties and class methods count)."""


def class_sizes(path: Path) -> list[tuple[str, int, int]]:
    """(line and name, distinct `self.X` the class's methods assign, methods it defines) per class."""
    sizes = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ClassDef):
            continue
        methods = [item for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))]
        assigned = set()
        for method in methods:
            for sub in ast.walk(method):
                targets = (sub.targets if isinstance(sub, ast.Assign)
                           else [sub.target] if isinstance(sub, (ast.AugAssign, ast.AnnAssign)) else [])
                assigned |= {target.attr for whole in targets for target in ast.walk(whole)
                             if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                             and target.value.id == "self"}
                if (isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute)  # object.__setattr__(self, "x")
                        and sub.func.attr == "__setattr__" and len(sub.args) >= 2
                        and isinstance(sub.args[1], ast.Constant)):
                    assigned.add(sub.args[1].value)
        sizes.append((f"{node.name} (line {node.lineno})", len(assigned), len(methods)))
    return sizes


def oversized(root: Path) -> list[str]:
    return [f"{path.relative_to(root).as_posix()}: {name} sets {attributes} attributes, defines {methods} methods"
            for package in PACKAGES for path in sorted((root / package).rglob("*.py"))
            for name, attributes, methods in class_sizes(path)
            if attributes > MAX_ATTRIBUTES or methods > MAX_METHODS]


def test_no_class_sets_more_than_12_attributes_or_defines_more_than_25_methods():
    assert oversized(REPO) == []


def test_a_class_over_the_bar_is_caught(tmp_path):
    """Assignments in any method, tuple targets, augmented ones and object.__setattr__ all count; a
    name set twice counts once; a class's nested function counts with its method."""
    setters = "".join(f"        self.a{i} = {i}\n" for i in range(11))
    methods = "".join(f"    def m{i}(self): ...\n" for i in range(26))
    write_package(tmp_path, {
        "fastloader/__init__.py": "",
        "fastloader/big.py": (
            "class Wide:\n    def __init__(self):\n" + setters
            + "        self.a0, self.b = 1, 2\n        object.__setattr__(self, 'c', 3)\n"
            + "class Just:\n    def __init__(self):\n" + setters + "    def more(self):\n        self.z += 1\n"
            + "class Long:\n" + methods),
    })
    assert oversized(tmp_path) == ["fastloader/big.py: Wide (line 1) sets 13 attributes, defines 1 methods",
                                   "fastloader/big.py: Long (line 31) sets 0 attributes, defines 26 methods"]
