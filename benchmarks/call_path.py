"""How far a config travels: the calls among fastloader's own files from `build_loader` to the first
batch, traced (sys.setprofile), on the embedded demo (builtin:sample) or --data.

What it counts, on the torch backend without workers (every call in this process) and on DALI's
CPU flavour (its feed and driver threads traced too):

- files: the distinct files of the packages whose functions run (a module's import code is not counted);
- steps: the distinct calls from one file into another (caller file -> callee file), in the order
  first made;
- up a floor: steps whose callee stands on a higher floor than its caller (tests/test_layout.py's
  FLOORS: a base class calling its backend, a callback);
- back: steps into a file the path had already left (entered before, from elsewhere);
- config: the files whose functions are handed the config, or a section of it (an instance of a
  dataclass of fastloader/schema.py among a call's arguments): how far the config itself travels,
  where the files above count every helper the path calls.

    python benchmarks/call_path.py
    python benchmarks/call_path.py --backends torch --show
    python benchmarks/call_path.py --train '{"views": [{"count": 2, "size": 32}, {"count": 4, "size": 16}]}'
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

PACKAGES = ("fastloader", "dali_loader", "torch_loader")


def module_of(filename: str) -> str | None:
    """The dotted module of a file of the packages, None for any other file."""
    try:
        relative = Path(filename).resolve().relative_to(REPO)
    except ValueError:
        return None
    if relative.parts[0] not in PACKAGES:
        return None
    parts = list(relative.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def config_types() -> tuple[type, ...]:
    """The config's dataclasses: the whole Config and each of its sections."""
    import dataclasses

    from fastloader import schema
    return tuple(value for value in vars(schema).values()
                 if isinstance(value, type) and dataclasses.is_dataclass(value) and value.__module__ == schema.__name__)


class Tracer:
    """The distinct caller-file -> callee-file calls among the packages, in the order first made, and
    the files whose functions are handed the config (or a section of it), in the order first reached."""

    def __init__(self):
        self.steps: list[tuple[str, str]] = []
        self.seen: set[tuple[str, str]] = set()
        self.lock = threading.Lock()
        self.configs = config_types()
        self.reached: dict[str, list[str]] = {}

    def __call__(self, frame, event, arg):
        if event != "call" or frame.f_code.co_name == "<module>":  # a module's import is no step of the path
            return
        callee = module_of(frame.f_code.co_filename)
        if callee is None:
            return
        code = frame.f_code
        if code.co_qualname not in self.reached.get(callee, ()):
            arguments = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
            if any(isinstance(frame.f_locals.get(name), self.configs) for name in arguments):
                with self.lock:
                    self.reached.setdefault(callee, []).append(code.co_qualname)
        caller_frame = frame.f_back
        while caller_frame is not None and module_of(caller_frame.f_code.co_filename) is None:
            caller_frame = caller_frame.f_back  # through the standard library and torch, to our caller
        caller = module_of(caller_frame.f_code.co_filename) if caller_frame is not None else None
        if caller is None or caller == callee:
            return
        with self.lock:
            if (caller, callee) not in self.seen:
                self.seen.add((caller, callee))
                self.steps.append((caller, callee))


def traced(backend: str, data: str | None, train: dict | None = None
           ) -> tuple[list[tuple[str, str]], dict[str, list[str]]]:
    import fastloader

    config = {"backend": backend, "seed": 0, "workers": {"num_workers": 0},
              "dataset": {"root": data or "builtin:sample"}, "train": {"batch_size": 8, **(train or {})},
              "val": {"batch_size": 8}}
    tracer = Tracer()
    threading.setprofile(tracer)
    sys.setprofile(tracer)
    try:
        loader = fastloader.build_loader(config, "train")
        next(iter(loader))
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    loader.close()
    return tracer.steps, tracer.reached


def summary(steps: list[tuple[str, str]], reached: dict[str, list[str]]) -> dict:
    from test_layout import floor_of

    files: list[str] = []
    up = back = 0
    for caller, callee in steps:
        for module in (caller, callee):
            if module not in files:
                files.append(module)
        lower, higher = floor_of(caller), floor_of(callee)
        up += lower is not None and higher is not None and higher > lower
        back += files.index(callee) < files.index(caller)
    return {"files": len(files), "steps": len(steps), "up a floor": up, "back": back, "path": files,
            "config": len(reached), "config reaches": list(reached), "config's functions": reached}


def main() -> None:
    parser = argparse.ArgumentParser(prog="call_path.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="an imagenette-shaped folder (default: the embedded demo, builtin:sample)")
    parser.add_argument("--backends", default="torch,dali", help="comma-separated: torch, dali")
    parser.add_argument("--show", action="store_true",
                        help="print every step, caller -> callee, and the functions of each file handed the config")
    parser.add_argument("--train", type=json.loads, default={},
                        help='more keys of the train split, a JSON object: \'{"views": [...]}\', \'{"mixup": {...}}\'')
    parser.add_argument("--json", help="write the counts here")
    args = parser.parse_args()
    report = {}
    for backend in args.backends.split(","):
        if backend == "dali":
            import importlib.util
            if importlib.util.find_spec("nvidia.dali") is None:
                print("dali: skipped (NVIDIA DALI is not installed)")
                continue
        steps, reached = traced(backend, args.data, args.train)
        report[backend] = found = summary(steps, reached)
        print(f"{backend}: {found['files']} files, {found['steps']} steps, {found['up a floor']} up a floor, "
              f"{found['back']} back into a file already left; the config handed to {found['config']} files")
        if args.show:
            for caller, callee in steps:
                print(f"  {caller} -> {callee}")
            print("  the config handed to:")
            for module, functions in reached.items():
                print(f"    {module}: {', '.join(functions)}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
