"""`defaults.use_huge_pages`, which every command's `tune_process` applies: a large tensor is
faulted in on 2 MB pages, hundreds of times fewer faults than on 4 kB ones, and a setting the
user already made (THP_MEM_ALLOC_ENABLE=0) is kept. Each side runs in its own interpreter: the
allocator reads the setting once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import resource, torch
from spyre_verify.defaults import tune_process
tune_process()
def faults(): return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
before = faults()
torch.ones(1 << 24)  # 64 MB, above glibc's largest mmap threshold: a fresh mapping
print(faults() - before)
"""
PAGES = (1 << 24) * 4 // 4096  # the tensor's 4 kB pages
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def page_faults(env: dict[str, str]) -> int:
    base = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env={**base, **env}, capture_output=True, text=True, check=True
    )
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(
    not THP.exists() or "[never]" in THP.read_text(), reason="this kernel offers no transparent huge pages"
)
def test_a_large_tensor_faults_in_on_huge_pages_unless_the_user_said_no() -> None:
    assert page_faults({}) < PAGES // 10
    assert page_faults({"THP_MEM_ALLOC_ENABLE": "0"}) > PAGES // 2
