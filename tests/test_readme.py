"""The README and docs/ stay true: the README's commands are the ones CI runs, its snippets and output
blocks come out of real runs, every config key is in the reference (docs/config.md), and every
relative link points to a file (and heading) of the repository."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, cpu_only_env

from fastloader.config_build import all_dotted_keys

README = (REPO / "README.md").read_text()
CI = (REPO / ".ci" / "run").read_text()
CONFIG_REFERENCE = REPO / "docs" / "config.md"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
"""Every page a user reads: the README and docs/*.md."""


def readme_commands() -> list[str]:
    return [line for block in re.findall(r"```bash\n(.*?)```", README, re.S) for line in block.splitlines()]


def test_ci_runs_the_readme_setup_and_test_commands():
    commands = readme_commands()
    setup = next(c for c in commands if "pip install" in c)
    test = next(c for c in commands if "pytest" in c)
    assert setup.replace("pip install", "pip install -q") in CI
    assert test in CI


def reference_rows() -> list[set[str]]:
    """The backticked keys in the first column of each row of the config reference's key table."""
    text = CONFIG_REFERENCE.read_text()
    table = text[text.index("| key | default | meaning |"):].split("\n\n")[0]
    rows = [line for line in table.splitlines()[2:] if line.startswith("|")]
    return [set(re.findall(r"`([<>a-z_.]+)`", row.split("|")[1])) for row in rows]


def test_every_config_key_is_in_the_reference():
    documented = set().union(*reference_rows())
    missing = [key for key in all_dotted_keys() if key not in documented]
    assert not missing, f"not in the config reference {CONFIG_REFERENCE.relative_to(REPO)}: {missing}"


def test_the_reference_documents_no_key_the_schema_lacks():
    keys = set(all_dotted_keys()) | {"<split>"}
    stale = [key for row in reference_rows() for key in row if key not in keys]
    assert not stale, f"in {CONFIG_REFERENCE.relative_to(REPO)} but not a config key: {stale}"


def test_the_readme_links_every_docs_page():
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)\)", README))
    pages = {f"docs/{page.name}" for page in PAGES[1:]}
    assert pages, "docs/ holds no page"
    assert not pages - linked, f"docs pages the README does not link: {sorted(pages - linked)}"


def _without_code(text: str) -> str:
    """Markdown text without fenced blocks and code spans (a `#` in a shell block is no heading)."""
    return re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", text, flags=re.S))


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings: lowercase, punctuation dropped, spaces to '-',
    a repeated heading numbered."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} +(.+?) *$", re.sub(r"```.*?```", "", page.read_text(), flags=re.S), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        if seen[slug]:
            seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def test_anchor_slugs_follow_github():
    page = REPO / "docs" / "performance.md"
    found = anchors(page)
    assert {"gpu-h100-2026-11-22", "stall-accounting-loaderstats"} <= found, sorted(found)


def test_every_relative_link_points_to_a_file_and_heading_in_the_repository():
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", _without_code(page.read_text())):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(REPO)}: ({target})"
            if not file.is_relative_to(REPO):
                broken.append(f"{where} points outside the repository")
            elif not file.exists():
                broken.append(f"{where}: no such file")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{where}: no heading '#{anchor}' in {file.relative_to(REPO)}")
    assert not broken, "\n".join(broken)


def test_nothing_a_user_reads_points_outside_the_repository():
    outside = [f"{page.relative_to(REPO)}:{number}: {line.strip()}" for page in PAGES
               for number, line in enumerate(page.read_text().splitlines(), 1) if "../shared" in line]
    assert not outside, "\n".join(outside)


BLOCKS = [(m.start(), m.group(1), m.group(2)) for m in re.finditer(r"```(\w*)\n(.*?)```", README, re.S)]
"""(offset, language, text) of every fenced block, in order."""


def _block_after(marker: str, language: str) -> str:
    """The text of the first block in `language` ("" for output) that opens after the README text `marker`."""
    at = README.index(marker)
    return next(text for start, lang, text in BLOCKS if start > at and lang == language)


def _cpu_run(args: list[str], tmp_path) -> subprocess.CompletedProcess:
    """Run as the README's reader would on a CPU box (the GPU hidden, if there is one)."""
    # the repository first, then whatever else this interpreter was given (DALI may live on PYTHONPATH)
    python_path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = cpu_only_env(tmp_path / "cache", PYTHONPATH=python_path)
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=240)


def _shape(line: str, cache_dir: str) -> re.Pattern:
    """A README output line as a pattern: numbers, column padding and hashes may differ, words may not."""
    line = line.replace("/root/.cache/fastloader", "\0")
    pattern = re.escape(re.sub(r"[0-9a-f]{12,}", "\1", line.strip()))
    pattern = re.sub(r"\d+", r"\\d+", pattern)
    pattern = re.sub(r"(\\ )+", r"\\s+", pattern)
    return re.compile(pattern.replace("\1", "[0-9a-f]+").replace("\0", re.escape(cache_dir)))


def test_the_run_commands_output_block_has_the_shape_of_a_real_run(tmp_path):
    """The output under the README's run command: every line but '...' comes out of a real run, up to numbers."""
    pytest.importorskip("nvidia.dali", reason="the README's run reads the DALI line on a CPU box")
    command = next(c for c in readme_commands() if c.startswith(".venv/bin/fastloader bench configs/sample.yaml"))
    result = _cpu_run(["-m", "fastloader.cli", *command.split()[1:]], tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout + result.stderr
    block = _block_after(command, "")
    lines = [line for line in block.splitlines() if line.strip() and line.strip() != "..."]
    assert len(lines) > 8
    missing = [line for line in lines if not _shape(line, str(tmp_path / "cache")).search(out)]
    assert not missing, f"README lines that a real run does not print:\n{missing}\n---\n{out}"


def test_the_visibility_snippet_prints_the_backend_and_flavour_on_a_cpu_box(tmp_path):
    pytest.importorskip("nvidia.dali", reason="the snippet asks for the dali backend")
    snippet = _block_after("This runs anywhere", "python")
    result = _cpu_run(["-c", snippet], tmp_path)
    assert result.returncode == 0, result.stderr
    for line in _block_after(snippet, "").splitlines():  # the README's output, verbatim
        assert line in result.stdout + result.stderr, line
    assert "WARNING fastloader: backend dali for split 'train'" in result.stderr
    assert "flavour='cpu'" in result.stdout


def test_the_readme_commands_run_as_written_without_an_activated_venv():
    """A fresh clone's reader runs them in a shell whose PATH has no venv: every program is the venv's
    `.venv/bin/...` (the set-up's `python3 -m venv` makes it), and the venv has each one."""
    venv_bin = Path(sys.executable).parent
    commands = [c for block in re.findall(r"```bash\n(.*?)```", README, re.S)
                for c in block.replace("\\\n", " ").splitlines() if c.strip() and not c.startswith("#")]
    assert len(commands) >= 4
    for command in commands:
        for part in command.split("&&"):
            program = part.split()[0]
            if part.split()[:3] == ["python3", "-m", "venv"]:
                continue
            assert program.startswith(".venv/bin/"), f"README runs {program!r} from PATH: {command}"
            assert (venv_bin / program.removeprefix(".venv/bin/")).exists(), f"the venv has no {program}"


LOOP_ON_THE_DEMO = {"configs/imagenette.yaml": "configs/sample.yaml", "/data/imagenette2-320": "builtin:sample",
                    "range(10)": "range(2)"}
"""What the test of the README's training loop replaces, in plain sight: the embedded demo (128 px, no
download) for Imagenette, and 2 epochs for 10. The rest runs as printed, on the CPU."""


def test_the_training_loop_snippet_trains_on_the_embedded_demo(tmp_path):
    snippet = _block_after("A training loop:", "python")
    for old, new in LOOP_ON_THE_DEMO.items():
        assert old in snippet, f"the README's loop no longer holds {old!r}: update LOOP_ON_THE_DEMO"
        snippet = snippet.replace(old, new)
    result = _cpu_run(["-c", snippet], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "TorchLoader(split='train'" in result.stdout and "TorchLoader(split='val'" in result.stdout
    assert [epoch for epoch, _ in re.findall(r"^(\d+) (\d\.\d+|[01])$", result.stdout, re.M)] == ["0", "1"]
    # batches of 128 from 240 demo images: epochs of one batch, whose log line has no stall to give
    assert "epoch 1, rank 0: 128 images in 1 batch" in result.stderr and "nan" not in result.stderr


def test_realdata_selects_the_tests_of_real_photos_and_fastloader_photos_moves_them(tmp_path):
    """`pytest -m realdata` runs the tests that read real photos, from the folder FASTLOADER_PHOTOS names:
    here one that does not exist, so each is collected and skips naming it (the CPU; nothing is decoded)."""
    nowhere = tmp_path / "no-photos"
    env = {**os.environ, "FASTLOADER_PHOTOS": str(nowhere)}
    result = subprocess.run([sys.executable, "-m", "pytest", "-m", "realdata", "-q", "-rs", "-p", "no:cacheprovider",
                             str(REPO / "tests")], cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    summary = result.stdout.strip().splitlines()[-1]
    assert result.returncode == 0 and re.match(r"\d+ skipped, \d+ deselected in", summary), result.stdout[-3000:]
    reason = f"real photos not present at {nowhere} (set FASTLOADER_PHOTOS to their folder)"
    skipped = [line for line in result.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skipped and all(line.endswith(reason) for line in skipped), skipped
    assert any("tests/test_realphotos.py:" in line for line in skipped), skipped


def test_the_test_extra_holds_what_the_tests_import_and_the_readmes_set_up_names_it():
    """A fresh clone's `pip install -e '.[test]'` must give every optional package a test imports: timm
    was only in `bench`, so 9 tests skipped there and the README's count could not be reproduced."""
    pyproject = (REPO / "pyproject.toml").read_text()
    line = re.search(r"^test = \[(.*)\]$", pyproject, re.M).group(1)
    extra = {re.split(r"[<>=!~ ;\[]", name.strip().strip('"'))[0] for name in line.split(",")}
    tests = "".join(path.read_text() for path in (REPO / "tests").glob("*.py"))
    wanted = {name.split(".")[0] for name in re.findall(r"importorskip\(\"([\w.]+)\"", tests)} - {"nvidia"}
    wanted |= {"pytest", "pytest-timeout"}  # pyproject's `timeout = 300` is pytest-timeout's option
    assert wanted <= extra, f"imported by the tests, not in the test extra: {sorted(wanted - extra)}"
    setup = README[README.index("## Set up"):README.index("## Run")]
    assert all(name in setup for name in extra), [name for name in extra if name not in setup]


def test_the_readme_stays_under_300_lines():
    """The front page keeps the set-up, run and test commands, the config reference's link and the
    measured results; the detail lives in docs/."""
    assert len(README.splitlines()) < 300


def test_the_five_line_imagefolder_config_and_its_loop_run_as_written(tmp_path):
    """The README's first example: its YAML over a folder of class folders (the root replaced), its
    Python as it stands, on a CPU."""
    from conftest import write_solid_dataset

    root = write_solid_dataset(tmp_path / "my-images", per_class=3)
    yaml_text = _block_after("Your ImageFolder in five lines", "yaml").replace("/data/my-images", str(root))
    yaml_text = yaml_text.replace("batch_size: 128", "batch_size: 4").replace("batch_size: 256", "batch_size: 4")
    (tmp_path / "my.yaml").write_text(yaml_text)
    snippet = _block_after("Your ImageFolder in five lines", "python").replace("...", "assert len(labels) == 4")
    result = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, env=cpu_only_env(tmp_path / "cache"),
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]


def test_no_command_in_the_docs_writes_into_the_clone():
    """A command copied from a page leaves the clone as it was: a `--json`, `--plot` or `--out` file
    goes to an absolute path (/tmp, a scratch disk) or to bench-results/, which git ignores, never over
    a tracked file such as docs/bench.png nor as a stray bench.json in the tree."""
    assert "/bench-results/" in (REPO / ".gitignore").read_text().split()
    writes = []
    for page in PAGES:
        text = page.read_text()
        for match in re.finditer(r"--(?:json|plot|out)[ =]([^\s`)]+)", text):
            path = match.group(1)
            if not (path.startswith(("/", "$", "~", "bench-results/")) or re.fullmatch(r"[A-Z_]+", path)):
                writes.append(f"{page.name}:{text[:match.start()].count(chr(10)) + 1}: {match.group(0)}")
    assert not writes, f"commands that write into the clone: {writes}"
