"""Engine processes: a start that fails says why (an external endpoint has no log), and stopping an engine never
signals a process that only inherited its PID (after a reboot, or once the engine is long gone)."""

import os
import signal
import subprocess
import sys

import pytest

from serving.engines import process
from tests.conftest import free_port


def test_an_engine_without_a_log_that_never_answers_fails_to_start_with_the_reason():
    url = f"http://127.0.0.1:{free_port()}/v1/models"  # nothing listens there
    with pytest.raises(process.EngineStartFailed, match="did not answer"):
        process.wait_healthy(url, pid=None, log_path=None, timeout_s=0.5)


def test_stopping_a_launched_engine_stops_its_whole_process_group(tmp_path):
    pid = process.launch([sys.executable, "-c", "import subprocess, time; subprocess.Popen(['sleep', '60']); "
                                                "time.sleep(60)"], log_path=tmp_path / "engine.log")
    assert process.is_alive(pid)
    process.terminate(pid, grace_s=5)
    assert not process.is_alive(pid)


def test_a_pid_that_now_belongs_to_another_process_is_left_alone():
    """What a replica's stored PID points at after a reboot: some other process leading its own session."""
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        process.terminate(stranger.pid, grace_s=1)
        assert stranger.poll() is None
    finally:
        os.killpg(stranger.pid, signal.SIGKILL)
        stranger.wait()
