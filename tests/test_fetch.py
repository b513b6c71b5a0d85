import http.server
import json
import threading
import urllib.error
import urllib.request
import zipfile

import pytest

from minigpt.core.config import DataConfig
from minigpt.core.errors import DataError
from minigpt.data.fetch import USER_AGENT, fetch
from minigpt.testing.wikitext_fixture import release_for, write_zip


def data_cfg(source="wikitext2", path=None, mirrors=(), attempts=2):
    return DataConfig(source=source, path=str(path) if path else None, mirrors=list(mirrors), timeout_s=5.0,
                      attempts=attempts, retry_backoff_s=0.0)


def assert_nothing_written(out_dir):
    """No data/raw, and no temp leftovers beside it that could pass for output."""
    assert not out_dir.exists()
    leftovers = list(out_dir.parent.iterdir()) if out_dir.parent.exists() else []
    assert leftovers == []


def test_local_directory_is_copied_with_a_manifest(tmp_path, fixture_dir, fixture_files):
    out = tmp_path / "data" / "raw"
    manifest = fetch(data_cfg("local", fixture_dir), out)
    for name, data in fixture_files.items():
        assert (out / name).read_bytes() == data
    on_disk = json.loads((out / "manifest.json").read_text())
    assert on_disk == manifest
    assert manifest["verified_against"] is None
    assert manifest["files"]["val"]["file"] == "wiki.valid.raw"
    assert len(manifest["files"]["train"]["sha256"]) == 64


def test_official_zip_at_data_path_is_verified(tmp_path, fixture_zip, fixture_release):
    out = tmp_path / "data" / "raw"
    manifest = fetch(data_cfg("wikitext2", fixture_zip), out, release=fixture_release)
    assert manifest["verified_against"] == "fixture-wikitext"
    assert manifest["archive"]["sha256"] == fixture_release.archive_sha256


def test_wrong_archive_hash_is_refused_before_writing(tmp_path, fixture_zip, fixture_files):
    other = write_zip(tmp_path / "other.zip", {**fixture_files, "wiki.test.raw": b" = Other = \n"})
    release = release_for(other, fixture_files)  # "published" hashes of a different archive
    out = tmp_path / "data" / "raw"
    with pytest.raises(DataError, match="does not match the published"):
        fetch(data_cfg("wikitext2", fixture_zip), out, release=release)
    assert_nothing_written(out)


def test_member_hash_mismatch_in_directory_is_refused(tmp_path, fixture_dir, fixture_zip, fixture_release):
    (fixture_dir / "wiki.valid.raw").write_bytes(b" = Changed = \n")
    out = tmp_path / "data" / "raw"
    with pytest.raises(DataError, match=r"wiki.valid.raw is 14 bytes with SHA-256 .* but the published"):
        fetch(data_cfg("wikitext2", fixture_dir), out, release=fixture_release)
    assert_nothing_written(out)


@pytest.mark.parametrize("cut", [0.5, 0.95])
def test_truncated_zip_is_a_clear_error(tmp_path, fixture_zip, cut):
    data = fixture_zip.read_bytes()
    broken = tmp_path / "broken.zip"
    broken.write_bytes(data[: int(len(data) * cut)])
    out = tmp_path / "data" / "raw"
    with pytest.raises(DataError, match="corrupt or truncated zip"):
        fetch(data_cfg("local", broken), out)
    assert_nothing_written(out)


def test_corrupt_member_fails_its_crc(tmp_path, fixture_files):
    plain = tmp_path / "stored.zip"
    with zipfile.ZipFile(plain, "w", zipfile.ZIP_STORED) as zf:
        for name, data in fixture_files.items():
            zf.writestr(name, data)
    raw = bytearray(plain.read_bytes())
    raw[200] ^= 0xFF  # flip a byte inside the first member's data
    plain.write_bytes(bytes(raw))
    with pytest.raises(DataError, match="corrupt or truncated zip"):
        fetch(data_cfg("local", plain), tmp_path / "data" / "raw")


@pytest.mark.parametrize("evil", ["../wiki.train.raw", "/etc/wiki.train.raw", "a/../../x"])
def test_unsafe_member_names_are_refused(tmp_path, fixture_files, evil):
    archive = write_zip(tmp_path / "evil.zip", {**fixture_files, evil: b"x"}, folder="")
    out = tmp_path / "data" / "raw"
    with pytest.raises(DataError, match="refusing archive member"):
        fetch(data_cfg("local", archive), out)
    assert_nothing_written(out)
    assert not (tmp_path / "wiki.train.raw").exists()


def test_non_utf8_split_is_named(tmp_path, fixture_dir):
    (fixture_dir / "wiki.test.raw").write_bytes(b" = Title = \n caf\xe9 \n")
    out = tmp_path / "data" / "raw"
    with pytest.raises(DataError, match=r"wiki.test.raw is not UTF-8 \(byte 0xe9 at offset 16\)"):
        fetch(data_cfg("local", fixture_dir), out)
    assert_nothing_written(out)


def test_empty_split_is_named(tmp_path, fixture_dir):
    (fixture_dir / "wiki.valid.raw").write_bytes(b" \n \n")
    out = tmp_path / "data" / "raw"
    with pytest.raises(DataError, match="wiki.valid.raw is empty"):
        fetch(data_cfg("local", fixture_dir), out)
    assert_nothing_written(out)


def test_missing_local_path(tmp_path):
    with pytest.raises(DataError, match=r"data.path = '.*nowhere' does not exist"):
        fetch(data_cfg("local", tmp_path / "nowhere"), tmp_path / "data" / "raw")


def test_directory_without_the_files(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="missing wiki.train.raw, wiki.valid.raw, wiki.test.raw"):
        fetch(data_cfg("local", tmp_path / "empty"), tmp_path / "data" / "raw")


def test_failed_fetch_keeps_previous_output_untouched_until_success(tmp_path, fixture_dir):
    out = tmp_path / "data" / "raw"
    fetch(data_cfg("local", fixture_dir), out)
    before = (out / "manifest.json").read_bytes()
    with pytest.raises(DataError):
        fetch(data_cfg("local", tmp_path / "nowhere"), out)
    assert (out / "manifest.json").read_bytes() == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["raw"]


# ------------------------------------------------------------------ downloads from a local HTTP server

class Mirror:
    """A 127.0.0.1 HTTP server that behaves like the real mirrors, and worse."""

    def __init__(self, payload: bytes):
        self.payload = payload
        self.user_agents = []
        self.hits = {}
        mirror = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                mirror.user_agents.append(self.headers.get("User-Agent"))
                mirror.hits[self.path] = mirror.hits.get(self.path, 0) + 1
                agent = self.headers.get("User-Agent", "")
                if agent.startswith("Python-urllib") or self.path == "/forbidden.zip":
                    return self.send_error(403)
                if self.path == "/flaky.zip" and mirror.hits[self.path] == 1:
                    return self.send_error(503)
                if self.path == "/truncated.zip":
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(mirror.payload)))
                    self.end_headers()
                    self.wfile.write(mirror.payload[: len(mirror.payload) // 2])
                    return
                if self.path in ("/ok.zip", "/flaky.zip"):
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(mirror.payload)))
                    self.end_headers()
                    self.wfile.write(mirror.payload)
                    return
                self.send_error(404)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def url(self, path):
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def mirror(fixture_zip):
    with Mirror(fixture_zip.read_bytes()) as server:
        yield server


def test_download_sends_its_user_agent_where_the_default_gets_403(tmp_path, mirror, fixture_release):
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(mirror.url("/ok.zip"), timeout=5)
    assert err.value.code == 403
    out = tmp_path / "data" / "raw"
    manifest = fetch(data_cfg(mirrors=[mirror.url("/ok.zip")]), out, release=fixture_release)
    assert mirror.user_agents[-1] == USER_AGENT
    assert manifest["archive"]["url"] == mirror.url("/ok.zip")
    assert (out / "wiki.train.raw").exists()


def test_download_retries_a_server_error(tmp_path, mirror, fixture_release):
    fetch(data_cfg(mirrors=[mirror.url("/flaky.zip")], attempts=2), tmp_path / "raw", release=fixture_release)
    assert mirror.hits["/flaky.zip"] == 2


def test_truncated_download_is_retried_then_next_mirror_used(tmp_path, mirror, fixture_release):
    mirrors = [mirror.url("/truncated.zip"), mirror.url("/ok.zip")]
    manifest = fetch(data_cfg(mirrors=mirrors, attempts=2), tmp_path / "raw", release=fixture_release)
    assert mirror.hits["/truncated.zip"] == 2
    assert manifest["archive"]["url"] == mirror.url("/ok.zip")


def test_every_mirror_failing_names_each_and_both_ways_out(tmp_path, mirror, fixture_release):
    mirrors = [mirror.url("/forbidden.zip"), mirror.url("/missing.zip"), mirror.url("/truncated.zip")]
    out = tmp_path / "data" / "raw"
    with pytest.raises(DataError) as err:
        fetch(data_cfg(mirrors=mirrors, attempts=2), out, release=fixture_release)
    message = str(err.value)
    assert "forbidden.zip: HTTP 403" in message and "missing.zip: HTTP 404" in message
    assert "truncated body" in message
    assert "data.path" in message and "network access" in message
    assert mirror.hits["/forbidden.zip"] == 1, "a 403 is permanent: no retry"
    assert_nothing_written(out)


def test_offline_with_no_local_source(tmp_path, fixture_release):
    # port 9 on loopback: connection refused, as when offline
    out = tmp_path / "data" / "raw"
    with pytest.raises(DataError, match="could not download WikiText-2 from any mirror"):
        fetch(data_cfg(mirrors=["http://127.0.0.1:9/wikitext-2-raw-v1.zip"], attempts=1), out, release=fixture_release)
    assert_nothing_written(out)


def test_downloaded_archive_with_wrong_hash_is_refused(tmp_path, mirror, fixture_files, fixture_release):
    mirror.payload = write_zip(tmp_path / "x.zip", {**fixture_files, "wiki.test.raw": b"tampered"}).read_bytes()
    out = tmp_path / "data" / "raw"
    with pytest.raises(DataError, match="does not match the published fixture-wikitext archive"):
        fetch(data_cfg(mirrors=[mirror.url("/ok.zip")]), out, release=fixture_release)
    assert_nothing_written(out)


def test_a_split_above_the_size_limit_is_refused_before_it_is_read(tmp_path, fixture_dir, fixture_files, monkeypatch):
    import minigpt.data.fetch as fetch_module

    monkeypatch.setattr(fetch_module, "MAX_SPLIT_BYTES", 1000)
    out = tmp_path / "data" / "raw"
    with pytest.raises(DataError, match=r"wiki\.\w+\.raw: [\d,]+ bytes, above the 1,000-byte limit for one split"):
        fetch(data_cfg("local", fixture_dir), out)
    assert_nothing_written(out)
    archive = tmp_path / "bomb.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in fixture_files.items():
            zf.writestr(name, data if name != "wiki.test.raw" else b"a" * 100_000)  # compresses to ~100 bytes
    monkeypatch.setattr(fetch_module, "MAX_SPLIT_BYTES", max(len(d) for d in fixture_files.values()))
    with pytest.raises(DataError, match=r"bomb.zip:wiki.test.raw \(declared size\): 100,000 bytes, above the"):
        fetch(data_cfg("local", archive), out)
    assert_nothing_written(out)
