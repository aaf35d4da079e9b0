"""Flower processes for the tests: a SuperLink on a free localhost port with its own FLWR_HOME
and connection file, `flwr run`, and cleanup by process id (never by name)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent
APP = Path(__file__).resolve().parents[1] / "examples" / "flower-app"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Flower:
    """flower-superlink (insecure: local tests only) and the processes started next to it."""

    def __init__(self, home: Path, simulation: bool):
        self.home, self.port = Path(home), free_port()
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "tt"\n\n[superlink.tt]\naddress = "127.0.0.1:{self.port}"\ninsecure = true\n')
        self.env = dict(os.environ, FLWR_HOME=str(self.home), PATH=f"{BIN}:{os.environ.get('PATH', '')}",
                        FLWR_DISABLE_UPDATE_CHECK="1")
        self.procs: list[subprocess.Popen] = []
        cmd = [str(BIN / "flower-superlink"), "--insecure", "--disable-runtime-dependency-installation",
               "--host", "127.0.0.1", "--port", str(self.port), "--database", str(self.home / "state.db")]
        self.superlink = self.start(cmd + (["--simulation"] if simulation else []), "superlink")
        self.wait_healthy()

    def start(self, cmd, name: str) -> subprocess.Popen:
        log = open(self.home / f"{name}.log", "wb")
        p = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(p)
        return p

    def wait_healthy(self, timeout: float = 60.0) -> None:
        import httpx

        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.superlink.poll() is not None:
                raise RuntimeError(f"flower-superlink exited: {(self.home / 'superlink.log').read_text()[-2000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=1).is_success:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError("flower-superlink did not become healthy")

    def run(self, run_config: str, *extra, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "flwr"), "run", str(APP), "tt", "--run-config", run_config,
                               "--stream", *extra], env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    def close(self) -> None:
        """SIGTERM each process group we started (SuperLink with its SuperExec and app
        processes, SuperNodes), SIGKILL what is left after 10 s."""
        for p in reversed(self.procs):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in reversed(self.procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
