"""Issue 34, the smaller items: file modes, `kfactory creds -o`, a TLS hub without its CA."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from eventstore.codec import encode
from eventstore.duckdb_store import DuckDBEventStore
from eventstore.store import Recorded
from ops.accounts import ensure_credentials
from ops.selfsigned import make_tls
from tests.conftest import calibrated
from tests.test_cli_foundation import kfactory


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_store_and_its_wal_are_private(tmp_path: Path) -> None:
    path = tmp_path / "events.duckdb"
    store = DuckDBEventStore(path)
    try:
        event = calibrated()
        store.append([Recorded(event, encode(event), 1)], 1)
        for file in (path, path.with_name(path.name + ".wal")):
            if file.exists():
                assert _mode(file) == 0o600, (file, oct(_mode(file)))
    finally:
        store.close()
    assert _mode(path) == 0o600


def test_creds_leave_the_folder_alone_and_dash_is_stdout(tmp_path: Path) -> None:
    home = tmp_path / "home"
    ensure_credentials(home)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o755)
    done = kfactory("creds", "verifier", "-o", str(shared / "v.nk"), "--home", str(home))
    assert done.returncode == 0, done.stderr
    assert _mode(shared) == 0o755 and _mode(shared / "v.nk") == 0o600
    out = kfactory("creds", "verifier", "-o", "-", "--home", str(home), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (shared / "v.nk").read_text().strip()
    assert not (tmp_path / "-").exists()


def test_a_tls_server_without_its_ca_says_so(tmp_path: Path) -> None:
    files = make_tls(tmp_path / "tls")
    done = kfactory(
        "server",
        "--home",
        str(tmp_path / "home"),
        "--tls-cert",
        str(files.cert),
        "--tls-key",
        str(files.key),
        timeout=20,
    )
    assert done.returncode == 2 and "--tls-ca" in done.stderr, done.stderr
