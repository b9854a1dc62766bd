"""The message reader of compute steps: Dagster's temporary-file reader, reading each message only once its line is whole.

Built on Dagster's public `PipesMessageReader` interface; the upstream bug it avoids is described in
docs/operations.md and reproduced in tests/pipelines/test_pipes_reader.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import threading
import time
import warnings
from typing import Iterator

from dagster import PipesMessageReader, PipesSubprocessClient, PipesTempFileMessageReader, PreviewWarning
from dagster_pipes import PipesDefaultMessageWriter

# Dagster's own Pipes session reads this preview property on every compute step; the warning is not about our code.
warnings.filterwarnings("ignore", message=r"Function `PipesMessageReader\.expected_writer_count` is currently in preview", category=PreviewWarning)


class WholeLineMessageReader(PipesMessageReader):
    """Dagster's temporary-file message reader, except that a message is read only once its whole line is written.

    The child's Pipes writer appends each message as one JSON line through a buffered text file, so a message longer
    than the buffer (a rollouts table's samples, the evaluation's per-round numbers) reaches the file in pieces.
    Dagster's reader (`tail_file`) parses whatever `readline` returns; when it lands between two pieces, its thread
    dies on the JSONDecodeError and every later message of the step is lost: the outputs are on disk but never
    materialized (seen on this 2-core machine under load: `[pipes] framework exception occurred in
    PipesFileMessageReader reader thread`, then `did not yield or return expected outputs`).
    """

    def __init__(self, include_stdio_in_messages: bool = False, directory: str | os.PathLike | None = None):
        self.include_stdio_in_messages = include_stdio_in_messages
        self.directory = directory  # where the messages file's folder is made (None: the system's temporary folder)

    @contextlib.contextmanager
    def read_messages(self, handler) -> Iterator[dict]:
        with tempfile.TemporaryDirectory(prefix="rl-assets-pipes-", dir=self.directory) as directory:
            path = os.path.join(directory, "messages")
            open(path, "w", encoding="utf-8").close()
            session_closed = threading.Event()
            thread = threading.Thread(target=self._read, args=(path, handler, session_closed), daemon=True)
            thread.start()
            try:
                yield {PipesDefaultMessageWriter.FILE_PATH_KEY: path,
                       PipesDefaultMessageWriter.INCLUDE_STDIO_IN_MESSAGES_KEY: self.include_stdio_in_messages}
            finally:
                session_closed.set()
                thread.join()

    @staticmethod
    def _read(path: str, handler, session_closed: threading.Event) -> None:
        try:
            for line in whole_lines(path, session_closed.is_set):
                handler.handle_message(json.loads(line))
        except Exception:
            handler.report_pipes_framework_exception("WholeLineMessageReader reader thread", sys.exc_info())
            raise

    def no_messages_debug_text(self) -> str:
        return "Attempted to read messages from a local temporary file."


def whole_lines(path: str, should_stop) -> Iterator[str]:
    """The lines appended to `path`, each once its newline is there, until `should_stop()` and nothing more to read.

    `should_stop` is asked before each read, so what the writer wrote before it stopped is all read. A last piece
    without its newline is dropped: its writer died mid-message (its exit code says so).
    """
    pending = ""
    with open(path, encoding="utf-8") as stream:
        while True:
            stopping = should_stop()
            piece = stream.readline()
            if piece:
                pending += piece
                if pending.endswith("\n"):
                    yield pending
                    pending = ""
            elif stopping:
                return
            else:
                time.sleep(0.05)  # a wakeup beside the training child costs it time; 50 ms is still no wait anyone notices


def message_reader(pipes: PipesSubprocessClient, directory: str | os.PathLike | None = None):
    """The pipes resource's reader, with Dagster's default one replaced by `WholeLineMessageReader` (its stdio option,
    which this project never sets, is not carried over: it is not public), its file under `directory` when given (a
    folder a Slurm job's node shares)."""
    reader = pipes.message_reader
    return WholeLineMessageReader(directory=directory) if type(reader) is PipesTempFileMessageReader else reader
