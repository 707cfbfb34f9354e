"""The chaos runs' own servers are reaped only when their run is gone: ``make test`` runs chaos runs
of several test modules at once, and a run that starts must not SIGKILL the MariaDB or Kafka of a run
another test process is in the middle of (it did: the three-node run's checker found its database
gone). Real processes stand in for the servers (no service is needed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from harness.own_servers import CHAOS, Server


class Standin(Server):
    name = "reaping-standin"


def server_process() -> int:
    """A process whose command line names the chaos folder, as a run's servers' do, and whose parent
    is gone, as a server's whose run died is: its pid."""
    started = subprocess.run(["bash", "-c", f"{sys.executable} -c 'import time; time.sleep(120)' {CHAOS} "
                              ">/dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True)
    return int(started.stdout)


def running(pid: int) -> bool:
    """Alive: a process killed but not reaped yet (a zombie, state Z) is not."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_server_of_a_live_run_is_kept_and_one_of_a_run_gone_is_killed(tmp_path):
    CHAOS.mkdir(parents=True, exist_ok=True)
    live_owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    gone_owner = subprocess.Popen([sys.executable, "-c", "pass"])
    gone_owner.wait()
    kept, orphan = server_process(), server_process()
    files = [CHAOS / f"{Standin.name}.{live_owner.pid}.pid", CHAOS / f"{Standin.name}.{gone_owner.pid}.pid"]
    try:
        files[0].write_text(str(kept))
        files[1].write_text(str(orphan))
        Standin(tmp_path).reap_leftover()
        assert not running(orphan) and not files[1].exists()
        assert running(kept) and files[0].exists()
    finally:
        for pid in (kept, orphan):
            if running(pid):
                os.kill(pid, signal.SIGKILL)
        live_owner.kill()
        live_owner.wait()
        for file in files:
            file.unlink(missing_ok=True)
