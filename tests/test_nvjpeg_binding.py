"""Which nvJPEG DALI's decoders bind, by import order, in fresh processes with the real libraries
(fastloader.cuda_libraries, dali_loader.stack; issue 67). Checked on the CPU: the CPU flavour's
decoder loads the same nvImageCodec extension, which opens nvJPEG by its soname, as the GPU flavour's.

torchvision's wheel bundles an nvJPEG of its own under the same soname; whichever is loaded first is
the one every by-soname open gets. In each order the decode plan the GPU flavour would make in that
process must be for the bound nvJPEG: >= 13.2 (the wheel's), or no region with interpolated chroma.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO

pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is installed on Linux x86_64 / aarch64 only")

SCRIPT = r"""
import ctypes, io, json, logging, sys
said = []
class Keep(logging.Handler):
    def emit(self, record):
        said.append(record.getMessage())
logging.getLogger("fastloader").addHandler(Keep())
for name in sys.argv[1].split(","):
    if name:
        __import__(name)

import numpy as np
from PIL import Image
from nvidia.dali import fn, pipeline_def

# a real decode by DALI's decoder (CPU flavour): nvImageCodec's nvjpeg extension opens nvJPEG by its soname
buffer = io.BytesIO()
Image.new("RGB", (64, 48), (200, 10, 10)).save(buffer, "JPEG")
data = np.frombuffer(buffer.getvalue(), np.uint8)

@pipeline_def(batch_size=1, num_threads=1, device_id=None)
def pipe():
    return fn.decoders.image(fn.external_source(source=lambda: [data], batch=True), device="cpu")

p = pipe()
p.build()
decoded = np.array(p.run()[0][0]).shape
mapped = sorted({line.split()[-1] for line in open("/proc/self/maps") if "libnvjpeg." in line})

from dali_loader.pipeline import decode_plan
from dali_loader.stack import dali_cuda_major, nvjpeg_version, plan_nvjpeg
from fastloader.cuda_libraries import wheel_nvjpegs

major = dali_cuda_major()
library = ctypes.CDLL(f"libnvjpeg.so.{major}")  # what any by-soname open gets now
by_soname = []
for prop in range(3):
    value = ctypes.c_int()
    library.nvjpegGetProperty(prop, ctypes.byref(value))
    by_soname.append(value.value)
plan_version = plan_nvjpeg()
plan_nvjpeg()  # said once however many loaders a process builds
plans = {str(s): decode_plan(s, True, True, plan_version)._asdict() for s in ("auto", True, False)}
print(json.dumps({"decoded": decoded, "mapped": mapped, "by_soname": by_soname, "reported": nvjpeg_version(major),
                  "plan_version": plan_version, "plans": plans, "wheel": wheel_nvjpegs().get(major),
                  "said": [m for m in said if "DALI's decoders bind" in m]}))
"""


def bound_in_a_fresh_process(imports: str) -> dict:
    """What a process that imports `imports` (comma-separated, in order) first binds and plans."""
    result = subprocess.run([sys.executable, "-c", SCRIPT, imports], capture_output=True, text=True, timeout=240,
                            cwd=REPO, env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def no_region_with_interpolated_chroma_of_an_old_nvjpeg(found: dict) -> None:
    """The issue's bar: the bound nvJPEG is >= 13.2, or no plan asks a region with interpolated chroma."""
    if tuple(found["by_soname"][:2]) < (13, 2):
        for setting, plan in found["plans"].items():
            assert not (plan["region"] and plan["fancy"]), (setting, plan)


@pytest.mark.parametrize("first", ["fastloader", "dali_loader"])
def test_a_process_that_imports_fastloader_before_torchvision_binds_the_wheels_nvjpeg(first):
    """Device: CPU. fastloader (or the DALI backend) imported before torchvision binds the nvidia-nvjpeg
    wheel's library under the soname: DALI's decoder maps it, a by-soname open gets it, the reported
    version and the plan are its, with regions of subsampled JPEGs interpolated; nothing is said."""
    found = bound_in_a_fresh_process(f"{first},torchvision")
    wheel = found["wheel"]
    assert wheel and found["decoded"] == [48, 64, 3]
    assert wheel in found["mapped"], found["mapped"]
    assert found["by_soname"] == found["reported"] == found["plan_version"], found
    assert tuple(found["by_soname"][:2]) >= (13, 2), found  # pyproject's nvidia-nvjpeg
    assert found["plans"]["auto"] == {"fancy": True, "region": True, "why": found["plans"]["auto"]["why"]}
    assert found["said"] == []
    no_region_with_interpolated_chroma_of_an_old_nvjpeg(found)


def test_a_process_that_imports_torchvision_first_plans_for_the_nvjpeg_it_binds_and_says_why_once():
    """Device: CPU. torchvision imported first: its bundled nvJPEG holds the soname, DALI's decoder
    binds it (the wheel's file is never mapped by the decode), and the plan is made for its version, not
    the wheel's: below 13.2, train's regions repeat chroma (auto) or whole images are decoded (true). Said
    once, with the reason and the fix."""
    found = bound_in_a_fresh_process("torchvision")
    assert found["decoded"] == [48, 64, 3]
    assert found["wheel"] not in found["mapped"] and any("torchvision" in path for path in found["mapped"]), found
    assert found["by_soname"] == found["reported"] == found["plan_version"], found
    no_region_with_interpolated_chroma_of_an_old_nvjpeg(found)
    if tuple(found["by_soname"][:2]) >= (13, 2):
        pytest.skip(f"this torchvision bundles nvJPEG {found['by_soname']}: nothing to plan around")
    assert found["plans"]["auto"]["region"] and not found["plans"]["auto"]["fancy"]
    assert not found["plans"]["True"]["region"] and found["plans"]["True"]["fancy"]
    assert len(found["said"]) == 1, found["said"]
    words = found["said"][0]
    assert "torchvision.libs" in words and found["wheel"] in words and "import fastloader before torchvision" in words
    assert ".".join(map(str, found["by_soname"])) in words and "repeat chroma" in words
