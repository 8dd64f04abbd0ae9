"""Debian's PostgreSQL on loopback for the PostgreSQL tier (`make test-postgres`): a cluster
of its own in a temporary folder, on a free 127.0.0.1 port (no other address, no Unix
socket outside that folder), with the databases the cluster's manifests give MLflow and
Prefect (infra/base/postgres.yaml, mlflow.yaml), stopped and removed at the end.

PostgreSQL refuses to run as root: as root the cluster belongs to the `postgres` user the
Debian package creates, its commands run through `runuser`."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

USER = "agentrl"


def postgres_bin() -> Path | None:
    """The newest installed server's bin folder (Debian: /usr/lib/postgresql/<major>/bin)."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(p.split("/")[4])
    )
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Postgres:
    port: int
    root: Path

    def url(self, database: str, driver: str = "postgresql") -> str:
        return f"{driver}://{USER}@127.0.0.1:{self.port}/{database}"


def _as_owner(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@contextlib.contextmanager
def local_postgres(databases: tuple[str, ...] = ("mlflow", "prefect")) -> Iterator[Postgres]:
    """A running cluster with `databases` (owner: USER, trust on loopback only)."""
    bin_dir = postgres_bin()
    if bin_dir is None:
        raise RuntimeError("PostgreSQL is not installed: `make postgres` installs Debian's")
    root = Path(tempfile.mkdtemp(prefix="agentrl-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    root.chmod(0o700)
    data, port = root / "data", _free_port()
    run = dict(check=True, capture_output=True, text=True, timeout=300)
    try:
        subprocess.run(
            _as_owner(
                [
                    str(bin_dir / "initdb"),
                    "-D",
                    str(data),
                    "-U",
                    USER,
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--no-locale",
                ]
            ),
            **run,
        )
        options = f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={root}"
        subprocess.run(
            _as_owner(
                [
                    str(bin_dir / "pg_ctl"),
                    "-D",
                    str(data),
                    "-o",
                    options,
                    "-l",
                    str(root / "server.log"),
                    "-w",
                    "-t",
                    "120",
                    "start",
                ]
            ),
            **run,
        )
        try:
            for name in databases:
                subprocess.run(
                    _as_owner(
                        [
                            str(bin_dir / "createdb"),
                            "-h",
                            "127.0.0.1",
                            "-p",
                            str(port),
                            "-U",
                            USER,
                            name,
                        ]
                    ),
                    **run,
                )
            yield Postgres(port, root)
        finally:
            subprocess.run(
                _as_owner([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
                check=False,
                capture_output=True,
                timeout=120,
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
