"""The Pipes message reader of compute steps reads a message only once its whole line is in the file.

The child's Pipes writer appends a long message in pieces; a reader that parses half a line dies and every later
message of the step is lost (Dagster's own file reader did, under load: see pipelines.launch.pipes_reader.WholeLineMessageReader).
"""

import json
import threading
import time

import pytest
from dagster import PipesSubprocessClient, PipesTempFileMessageReader

from pipelines.launch.pipes_reader import WholeLineMessageReader, message_reader, whole_lines


class Handler:
    def __init__(self):
        self.messages, self.errors = [], []

    def handle_message(self, message):
        self.messages.append(message)

    def report_pipes_framework_exception(self, origin, exc_info):
        self.errors.append((origin, exc_info[1]))


LONG = {"method": "report_asset_materialization", "params": {"metadata": {"samples": "x" * 20_000}}}
CLOSED = {"method": "closed", "params": {}}


def written_in_pieces(reader) -> Handler:
    """What `reader` hands on when a long message reaches its file in two writes, 0.3 s apart, and a short one follows."""
    line = json.dumps(LONG) + "\n"
    handler = Handler()
    with reader.read_messages(handler) as params:
        with open(params["path"], "a", encoding="utf-8") as out:
            out.write(line[:281])  # where the half-written line cut Dagster's reader off
            out.flush()
            time.sleep(0.3)  # the reader sees the piece and waits for the rest
            out.write(line[281:] + json.dumps(CLOSED) + "\n")
    return handler


def test_a_message_written_in_pieces_is_read_once_whole_and_the_messages_after_it_still_arrive():
    handler = written_in_pieces(WholeLineMessageReader())
    assert handler.errors == []
    assert handler.messages == [LONG, CLOSED]


def test_the_lines_written_before_the_session_closes_are_all_read_and_a_last_half_line_is_dropped(tmp_path):
    path = tmp_path / "messages"
    path.write_text('{"a": 1}\n{"b": 2}\n{"c": ')  # the writer died in its third message
    stop = threading.Event()
    stop.set()  # closed before the reader even looked: it still reads what is there
    assert [json.loads(line) for line in whole_lines(str(path), stop.is_set)] == [{"a": 1}, {"b": 2}]


def test_only_dagsters_default_reader_is_replaced():
    assert isinstance(message_reader(PipesSubprocessClient()), WholeLineMessageReader)
    # Dagster's file reader in any configuration (its options are private: not carried over; this project sets none)
    assert isinstance(message_reader(PipesSubprocessClient(message_reader=PipesTempFileMessageReader())), WholeLineMessageReader)
    custom = WholeLineMessageReader()
    assert message_reader(PipesSubprocessClient(message_reader=custom)) is custom


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # its reader thread dies: the bug
def test_dagsters_own_reader_loses_the_message_written_in_pieces_and_every_one_after():
    """The upstream bug (docs/operations.md): when this starts failing, Dagster's reader reads whole lines and ours can go."""
    handler = written_in_pieces(PipesTempFileMessageReader())
    assert handler.messages == [] and [origin for origin, _ in handler.errors] == ["PipesFileMessageReader reader thread"]
