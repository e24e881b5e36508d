"""hora run's output pump forwards output as it arrives: partial lines and carriage-return redraws (progress bars)
show live, every line start keeps its rank prefix, and ranks never run together on one line."""

from __future__ import annotations

import os
import time

from hora.runner.output import OutputPump


def _pump(tmp_path=None, capture=False, prefix=True, hold=0.0) -> OutputPump:
    pump = OutputPump(str(tmp_path) if tmp_path else None, capture=capture, prefix=prefix, hold=hold)
    for rank in (0, 1):
        pump.add_remote(rank)  # fed by hand, as a remote host's agent feeds it
    return pump


def test_a_progress_bar_shows_live_with_its_prefix_kept(capsys):
    pump = _pump()
    pump.feed(0, "stderr", b" 10%|#")
    assert capsys.readouterr().err == "[0]<stderr>:  10%|#"  # before any newline
    pump.feed(0, "stderr", b"\r 50%|#####")
    assert capsys.readouterr().err == "\r[0]<stderr>:  50%|#####"
    pump.feed(0, "stderr", b"\r100%|##########|\n")
    assert capsys.readouterr().err == "\r[0]<stderr>: 100%|##########|\n"
    pump.close_remote(0, "stderr")
    assert pump.tails[0][-1] == "100%|##########|"  # the report shows what the terminal showed last


def test_another_ranks_line_ends_an_unfinished_one_first(capsys):
    pump = _pump()
    pump.feed(0, "stdout", b"loading")
    pump.feed(1, "stdout", b"ready\n")
    pump.feed(0, "stdout", b" done\n")
    assert capsys.readouterr().out == "[0]<stdout>: loading\n[1]<stdout>: ready\n[0]<stdout>:  done\n"


def test_an_unfinished_last_line_is_ended_when_the_stream_closes(capsys):
    pump = _pump()
    pump.feed(1, "stdout", b"no newline at the end")
    pump.close_remote(1, "stdout")
    assert capsys.readouterr().out == "[1]<stdout>: no newline at the end\n"


def test_empty_lines_and_crlf_keep_their_prefix(capsys):
    pump = _pump()
    pump.feed(0, "stdout", b"a\r\n\nb\n")
    assert capsys.readouterr().out == "[0]<stdout>: a\n[0]<stdout>: \n[0]<stdout>: b\n"


def test_files_get_the_raw_bytes_and_captures_get_lines(tmp_path, capsys):
    pump = _pump(tmp_path)
    pump.feed(0, "stderr", b"10%\r100%\nnext\n")
    pump.close_remote(0, "stderr")
    assert (tmp_path / "rank.0" / "stderr").read_bytes() == b"10%\r100%\nnext\n"
    assert os.path.exists(tmp_path / "rank.0" / "stdout")
    capsys.readouterr()
    captured = _pump(capture=True)
    captured.feed(0, "stdout", b"x\r\ny")
    captured.close_remote(0, "stdout")
    assert captured.lines[0]["stdout"] == ["x", "y"]
    assert capsys.readouterr() == ("", "")  # captured output is not printed


def test_without_prefix_the_text_is_passed_through(capsys):
    pump = _pump(prefix=False)
    pump.feed(0, "stdout", b"50%\r100%\n")
    assert capsys.readouterr().out == "50%\r100%\n"


def test_print_pieces_of_two_ranks_are_not_cut_into_each_others_lines(capsys):
    pump = _pump(hold=30.0)  # unbuffered print() writes "a", " ", "b", "\\n" separately
    for piece in (b"epoch", b" ", b"1"):
        pump.feed(0, "stdout", piece)
        pump.feed(1, "stdout", piece)
    pump.feed(1, "stdout", b"\n")
    pump.feed(0, "stdout", b"\n")
    assert capsys.readouterr().out == "[1]<stdout>: epoch 1\n[0]<stdout>: epoch 1\n"


def test_a_held_partial_line_shows_once_it_has_waited(capsys):
    pump = _pump(hold=0.05)
    pump.feed(0, "stdout", b"Downloading...")
    assert capsys.readouterr().out == ""  # waits for the rest of its line
    time.sleep(0.1)
    pump.feed(1, "stderr", b"")  # any later event lets the pump look at held lines
    assert capsys.readouterr().out == "[0]<stdout>: Downloading..."
    pump.feed(0, "stdout", b" done\n")
    assert capsys.readouterr().out == " done\n"


def test_a_character_split_across_reads_is_shown_whole(capsys):
    pump = _pump()
    bar = "\r 50%|\u2588\u2588".encode()
    pump.feed(0, "stderr", bar[:-1])
    pump.feed(0, "stderr", bar[-1:] + b"\n")
    assert capsys.readouterr().err == "[0]<stderr>:  50%|\u2588\u2588\n"
