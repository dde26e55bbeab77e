"""A sweep that stops early loses nothing and says so in one line: a full disk (ENOSPC while a
result is written) and Ctrl-C. Both run the real sweep (fixed solutions, a real ``LocalPool`` on
CPU) through the real ``kernelrl eval`` entry point.

The full disk is injected at the one ``write(2)`` through which results reach the disk
(``kernelrl.eval.records._write``): once the "disk" is full every write fails with ENOSPC, the
first one after writing part of its bytes, as a real full disk does."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernelrl.eval import records as records_module
from kernelrl.eval.records import read_records
from kernelrl.launch.cli import main

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "eval" / "fixed_bundled.yaml"


def sweep_args(out: Path, regex: str) -> list[str]:
    return [
        "eval",
        "--config",
        str(RECIPE),
        "--output_dir",
        str(out),
        "--task_regex",
        regex,
        "--env_device",
        "cpu",
        "--env_workers",
        "2",
    ]


class FullDisk:
    """``_write`` for a disk that fills up at the N-th append to samples.jsonl: that write
    stores half its bytes, then every write anywhere fails with ENOSPC."""

    def __init__(self, appends_that_fit: int) -> None:
        self.appends_left = appends_that_fit
        self.full = False
        self.refused = 0

    def __call__(self, fd: int, data: bytes | memoryview) -> int:
        if self.full:
            self.refused += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if os.readlink(f"/proc/self/fd/{fd}").endswith("samples.jsonl"):
            if self.appends_left == 0:
                self.full = True
                return os.write(fd, bytes(data[: len(data) // 2]))  # a short write
            self.appends_left -= 1
        return os.write(fd, data)


def test_full_disk_during_a_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    # 1. A finished sweep of one task (2 fixed samples): its report exists.
    assert main(sweep_args(out, "^01_relu$")) == 0
    summary_before = (out / "summary.json").read_bytes()
    report_before = (out / "report.md").read_bytes()
    assert len(read_records(out / "samples.jsonl")) == 2
    capfd.readouterr()

    # 2. The same folder with a second task (2 more samples); the disk fills after one of them.
    disk = FullDisk(appends_that_fit=1)
    monkeypatch.setattr(records_module, "_write", disk)
    code = main(sweep_args(out, "^(01_relu|02_gelu_tanh)$"))
    err = capfd.readouterr().err
    assert code == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("kernelrl eval: cannot write ") and "No space left on device" in last
    assert "1 evaluated attempt could not be saved" in last, last
    assert "3 attempts are saved" in last and "run the same command again" in last, last
    assert disk.full
    # Nothing lost: the earlier report is intact, the store holds only complete lines.
    assert (out / "summary.json").read_bytes() == summary_before
    assert (out / "report.md").read_bytes() == report_before
    text = (out / "samples.jsonl").read_text()
    assert text.endswith("\n") and len(text.splitlines()) == 3
    assert all(json.loads(line)["turn_base"] == 1 for line in text.splitlines())
    assert not list(out.rglob("*.tmp"))

    # 3. Space again: the rerun evaluates only the lost attempt.
    monkeypatch.undo()
    assert main(sweep_args(out, "^(01_relu|02_gelu_tanh)$")) == 0
    err = capfd.readouterr().err
    assert "resuming" in err and "3 attempts already done" in err
    assert len(read_records(out / "samples.jsonl")) == 4
    summary = json.loads((out / "summary.json").read_text())
    assert summary["views"]["last"]["overall"]["attempts"] == 4


def test_ctrl_c_stops_quickly_and_resumes(tmp_path: Path) -> None:
    """SIGINT (what Ctrl-C sends to the foreground process; sandboxes have their own session)
    after the first saved attempt: queued evaluations are cancelled, the running one finishes,
    one line says what was kept; the same command finishes the sweep."""
    out = tmp_path / "run"
    regex = "^(01_relu|02_gelu_tanh|06_row_sum|14_softmax_rows|18_matmul)$"  # 10 attempts
    command = [sys.executable, "-m", "kernelrl.launch.cli", *sweep_args(out, regex)]
    command[command.index("--env_workers") + 1] = "1"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        command,
        cwd=REPO,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        # as in a terminal, whatever this test inherited (a background job ignores SIGINT)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    store = out / "samples.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if store.exists() and store.read_text().count("\n") >= 1:
            break
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    interrupted = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    stop_s = time.monotonic() - interrupted
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("kernelrl eval: interrupted: "), last
    assert "run the same command again to resume" in last and "queued evaluation" in last
    kept = len(read_records(store))
    assert f"{kept} attempt{'s are' if kept > 1 else ' is'} saved" in last, last
    assert 1 <= kept < 10
    # One evaluation at a time: at most the running one finishes (seconds), not the 9 queued.
    assert stop_s < 60, stop_s

    again = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming {out}: {kept} attempts already done" in " ".join(again.stderr.split())
    assert len(read_records(store)) == 10
