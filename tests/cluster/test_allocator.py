"""The ranks' allocator in a running process: large tensors reuse the heap (no page faults)."""

import platform
import subprocess
import sys

import pytest

from ddlsim.cluster.allocator import ALLOCATOR_ENV, use_rank_allocator

# Six 100 MiB tensors allocated and freed in turn; prints the minor page faults the last two took
# (the heap grows over the first ones: two or three of them, from one run to the next).
_PROGRAM = """
import resource, sys, torch
if sys.argv[1] == "rank":
    from ddlsim.cluster.allocator import use_rank_allocator
    assert use_rank_allocator()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for i in range(6):
    if i == 4:
        before = faults()
    x = torch.ones(25 * 2**20)
    del x
print(faults() - before)
"""


def _faults(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", _PROGRAM, mode],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_rank_allocator_reuses_large_tensors() -> None:
    default, rank = _faults("default"), _faults("rank")
    # glibc's default maps each 100 MiB tensor anew (25,600 pages each); under the ranks'
    # setting, once the heap has grown, a tensor reuses it and touches no new page
    assert default >= 2 * 25_600
    assert rank <= default / 10


def test_the_setting_is_applied_once_where_the_c_library_has_it() -> None:
    assert use_rank_allocator() is (platform.libc_ver()[0] == "glibc")
    assert use_rank_allocator() is use_rank_allocator()
    assert int(ALLOCATOR_ENV["MALLOC_MMAP_THRESHOLD_"]) >= 2**31 - 1  # in-process: capped
