"""An edited raw source makes raw_data stale for `rl-assets run`, naming the file (found by a new user: it was 'up to date')."""

from __future__ import annotations

import pytest

from conftest import python

pytestmark = pytest.mark.e2e


def test_an_edited_raw_file_reruns_from_raw_data_and_says_which(micro_copy):
    python(["-m", "pipelines", "run"], micro_copy, timeout=900)
    source = micro_copy / "data" / "raw" / "arithmetic_extra.jsonl"
    source.write_text(source.read_text() + '{"question": "11+11=", "solution": "22"}\n')
    again = python(["-m", "pipelines", "run"], micro_copy, timeout=900)
    said = again.stdout + again.stderr
    assert "from raw_data (stale: raw sources changed or missing since read: ['data/raw/arithmetic_extra.jsonl'])" in said, said[-3000:]
    after = python(["-m", "pipelines", "run"], micro_copy, timeout=900)
    assert "nothing to do" in after.stdout + after.stderr  # made again from the file as it is now: up to date
