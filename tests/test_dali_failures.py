"""The DALI loader's table of cases (dali_loader/failures.py), row by row: which way the driver
ends leads to what, and which error the trainer gets, raised from what. The rows' outcomes in a
running loader (a bad file rebuilt around, a hook's error, out of memory) are test_dali.py's,
test_dali_driver.py's and test_hooks.py's. Device: none (the table is a pure function)."""
from __future__ import annotations

import pytest

pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is installed on Linux x86_64 / aarch64 only")

from dali_loader.failures import Ending, Then, case_of  # noqa: E402
from fastloader.errors import HookError, SourceError, StoreError  # noqa: E402
from fastloader.hooks import Hook  # noqa: E402

GRAPH = Hook(lambda images, seeds: images, "graph_hook", "dali.graph_hook", "tests:graph")
OPERATOR = RuntimeError("Critical error in pipeline:\nError in CPU operator `nvidia.dali.fn.crop_mirror_normalize`,\n"
                        "which was used in the pipeline definition with the following traceback:\n"
                        "encountered:\nExpected 3 channels, got 1")
DECODER = RuntimeError("Error in MIXED operator `nvidia.dali.fn.decoders.image_random_crop` encountered:\n"
                       "nvJPEG error: bad huffman table")


def _ending(error=None, in_pipeline=True, closed=False, graph=None, hook_failure=None, source_failure=None):
    return Ending(error, in_pipeline, closed, graph, hook_failure, source_failure)


def test_a_closed_loader_and_the_epochs_end_come_first():
    assert case_of(_ending(OPERATOR, closed=True, graph=GRAPH)).then is Then.CLOSED
    assert case_of(_ending(None, in_pipeline=False)).then is Then.END


def test_an_operators_failure_after_a_graph_function_is_the_functions_error_raised_from_nothing():
    case = case_of(_ending(OPERATOR, graph=GRAPH))
    raised = case.raised(_ending(OPERATOR, graph=GRAPH))
    assert case.then is Then.STOP and isinstance(raised, HookError)
    assert "dali.graph_hook tests:graph returned a DataNode" in str(raised) and "Expected 3 channels" in str(raised)
    assert raised.__cause__ is None and raised.__suppress_context__
    assert case_of(_ending(DECODER, graph=GRAPH)).then is Then.PROBE  # a decoder's: maybe a file's
    shape = ValueError("Critical error in pipeline:\nError in CPU operator `nvidia.dali.fn.crop_mirror_normalize`"
                       " encountered:\nThe number of dimensions 0 does not match")  # DALI's word for the seeds' node
    assert isinstance(case_of(_ending(shape, graph=GRAPH)).raised(_ending(shape, graph=GRAPH)), HookError)


@pytest.mark.parametrize("error, in_pipeline", [
    (RuntimeError("CUDA error: out of memory"), True),  # nobody's fault
    (StoreError("s3://bucket/shard-0.tar: unreachable after 5 retries"), True),  # no sample's fault
    (ValueError("the finisher failed"), False),  # not an operator's
    (RuntimeError("the hand-over to torch failed"), False),
    (KeyboardInterrupt(), True),  # an interrupt inside DALI's run
])
def test_an_error_no_file_explains_stops_the_loader_raising_it_as_it_is(error, in_pipeline):
    ending = _ending(error, in_pipeline=in_pipeline, graph=GRAPH if in_pipeline else None)
    case = case_of(ending)
    assert case.then is Then.STOP and case.raised(ending) is error and error.__cause__ is None


def test_a_sample_hooks_error_and_a_changed_source_are_raised_from_dalis():
    hook_failure, changed = HookError("train.transform.sample_hook tests:h raised"), SourceError("source changed")
    for ending, kept in ((_ending(OPERATOR, hook_failure=hook_failure, source_failure=changed), hook_failure),
                         (_ending(OPERATOR, source_failure=changed), changed)):
        case = case_of(ending)
        assert case.then is Then.STOP and case.raised(ending) is kept and kept.__cause__ is OPERATOR


def test_any_other_operators_failure_is_probed_for_files():
    assert case_of(_ending(OPERATOR)).then is Then.PROBE
    assert case_of(_ending(DECODER)).then is Then.PROBE
