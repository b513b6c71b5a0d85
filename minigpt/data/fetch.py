"""Stage `fetch`: get WikiText raw text into data/raw/, verified before anything is written there.

Sources, in order: `data.path` (a directory with wiki.{train,valid,test}.raw or a zip holding them), then the
download mirrors. With data.source = wikitext2 every file is checked against the published SHA-256 and size
(and a zip's own SHA-256); with data.source = local the hashes are only recorded in data/raw/manifest.json.
"""

from __future__ import annotations

import http.client
import socket
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from tqdm import tqdm

from minigpt.core.config import DataConfig
from minigpt.core.errors import DataError
from minigpt.core.io_utils import atomic_directory, atomic_write_json, sha256_bytes, sha256_file
from minigpt.core.paths import SPLIT_FILES

# project split name -> WikiText file name
MANIFEST_NAME = "manifest.json"
# Bounds before anything is read whole (a zip bomb or a multi-GB file would exhaust memory): WikiText-103's
# largest file, wiki.train.raw, is 0.54 GB, its zip 0.19 GB; each split may be at most 1 GiB, a download 1 GiB.
MAX_SPLIT_BYTES = 1 << 30
MAX_DOWNLOAD_BYTES = 1 << 30
# wikitext.smerity.com answers 403 to urllib's default "Python-urllib/3.x"
USER_AGENT = "minigpt-fetch/0.1 (WikiText-2 research download)"


@dataclass(frozen=True)
class Release:
    """Published checksums of a release: the archive and each member file (by WikiText file name)."""

    name: str
    archive_sha256: str | None
    archive_bytes: int | None
    members: dict[str, tuple[str, int]] = field(default_factory=dict)


# Published values for wikitext-2-raw-v1 (the sizes and SHA-256 of the official release; docs/data-and-config.md).
WIKITEXT2_RAW = Release(
    name="wikitext-2-raw-v1",
    archive_sha256="ef7edb566e3e2b2d31b29c1fdb0c89a4cc683597484c3dc2517919c615435a11",
    archive_bytes=4_721_645,
    members={
        "wiki.train.raw": ("6707892fa3788b5ab9ed78ab5ff37d9fe825f6011a2ad4fcd6a6d467f0e7da57", 10_940_747),
        "wiki.valid.raw": ("4cd0f6876d07a413aa911261ff6d363c72d757d47f0fdd6015702014c89cb9c7", 1_146_846),
        "wiki.test.raw": ("173c87a53759e0201f33e0ccf978e510c2042d7f2cb78229d9a50d79b9e7dd08", 1_290_590),
    },
)


class _Retryable(Exception):
    """A transient download failure (timeout, 5xx, truncated body): worth another attempt."""


# ---------------------------------------------------------------- reading sources

def _check_member_name(name: str, archive: Path) -> None:
    posix = PurePosixPath(name.replace("\\", "/"))
    if posix.is_absolute() or ".." in posix.parts or (len(name) > 1 and name[1] == ":"):
        raise DataError(
            f"{archive}: refusing archive member '{name}' (absolute path or '..'); the archive is unsafe or not "
            "WikiText. Use the official wikitext-2-raw-v1.zip or a directory of wiki.*.raw files."
        )


def read_zip(archive: Path) -> dict[str, bytes]:
    """The three WikiText files from a zip, found by file name in any one folder; unsafe names refused."""
    try:
        with zipfile.ZipFile(archive) as zf:
            infos = zf.infolist()
            for info in infos:
                _check_member_name(info.filename, archive)
            files = {}
            for wanted in SPLIT_FILES.values():
                matches = [i for i in infos if PurePosixPath(i.filename).name == wanted and not i.is_dir()]
                if len(matches) != 1:
                    found = "none" if not matches else ", ".join(i.filename for i in matches)
                    raise DataError(f"{archive}: expected exactly one member named {wanted}, found {found}.")
                files[wanted] = _read_member(zf, matches[0], archive)
            return files
    except (zipfile.BadZipFile, EOFError, zipfile.LargeZipFile) as exc:
        raise DataError(
            f"{archive}: corrupt or truncated zip ({exc}). Delete it and download it again, or point data.path at "
            "an intact copy."
        ) from None


def _too_large(origin: str, size: int) -> DataError:
    return DataError(f"{origin}: {size:,} bytes, above the {MAX_SPLIT_BYTES:,}-byte limit for one split "
                     "(minigpt.data.fetch.MAX_SPLIT_BYTES, well above WikiText-103's 0.54 GB train file); it is not a "
                     "WikiText split, or an archive that expands far beyond its size.")


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, archive: Path) -> bytes:
    """A member's bytes, refused when its declared size or what it actually expands to exceeds the limit."""
    origin = f"{archive}:{info.filename}"
    if info.file_size > MAX_SPLIT_BYTES:
        raise _too_large(origin + " (declared size)", info.file_size)
    with zf.open(info) as member:
        data = member.read(MAX_SPLIT_BYTES + 1)  # never more than the limit, whatever the header claims
    if len(data) > MAX_SPLIT_BYTES:
        raise _too_large(origin + " (expanded size)", len(data))
    return data


def read_directory(directory: Path) -> dict[str, bytes]:
    for candidate in (directory, directory / "wikitext-2-raw"):
        if all((candidate / name).is_file() for name in SPLIT_FILES.values()):
            for name in SPLIT_FILES.values():
                size = (candidate / name).stat().st_size
                if size > MAX_SPLIT_BYTES:
                    raise _too_large(str(candidate / name), size)
            return {name: (candidate / name).read_bytes() for name in SPLIT_FILES.values()}
    missing = [n for n in SPLIT_FILES.values() if not (directory / n).is_file()]
    raise DataError(f"{directory}: missing {', '.join(missing)}; the directory must hold wiki.train.raw, "
                    "wiki.valid.raw and wiki.test.raw.")


def read_local(path: Path) -> dict[str, bytes]:
    if not path.exists():
        raise DataError(
            f"data.path = {str(path)!r} does not exist. Point it at a directory with wiki.{{train,valid,test}}.raw "
            "or at wikitext-2-raw-v1.zip (an absolute path), e.g. dvc exp run -S data.path=/abs/path."
        )
    return read_directory(path) if path.is_dir() else read_zip(path)


# ---------------------------------------------------------------- verification

def verify_archive(archive: Path, release: Release) -> None:
    size = archive.stat().st_size
    digest = sha256_file(archive)
    if release.archive_sha256 and digest != release.archive_sha256:
        raise DataError(
            f"{archive}: SHA-256 {digest} ({size} bytes) does not match the published {release.name} archive "
            f"({release.archive_sha256}, {release.archive_bytes} bytes); it is corrupt, truncated or another file. "
            "Delete it and download it again."
        )


def verify_members(files: dict[str, bytes], release: Release, origin: str) -> None:
    for name, data in files.items():
        expected = release.members.get(name)
        if expected is None:
            continue
        sha, size = expected
        digest = sha256_bytes(data)
        if len(data) != size or digest != sha:
            raise DataError(
                f"{origin}: {name} is {len(data)} bytes with SHA-256 {digest}, but the published {release.name} file "
                f"is {size} bytes with SHA-256 {sha}. The copy is corrupt or not the official release; use data=local "
                "for a corpus of your own."
            )


def check_text(files: dict[str, bytes], origin: str) -> dict[str, int]:
    """Every split must be non-empty UTF-8; returns each file's character count."""
    chars = {}
    for name, data in files.items():
        if not data.strip():
            raise DataError(f"{origin}: {name} is empty; every split (train, valid, test) needs text.")
        try:
            chars[name] = len(data.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise DataError(
                f"{origin}: {name} is not UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start}). "
                "Re-save the file as UTF-8 or fetch an intact copy."
            ) from None
    return chars


# ---------------------------------------------------------------- download

def _download_once(url: str, dest: Path, timeout_s: float) -> None:
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response, open(dest, "wb") as out:
            total = response.headers.get("Content-Length")
            total = int(total) if total is not None else None
            if total is not None and total > MAX_DOWNLOAD_BYTES:
                raise DataError(f"the server announces {total:,} bytes, above the {MAX_DOWNLOAD_BYTES:,}-byte download "
                                "limit; this is not the WikiText archive")
            received = 0
            with tqdm(total=total, unit="B", unit_scale=True, desc=f"download {url.rsplit('/', 1)[-1]}",
                      disable=None) as bar:
                while True:
                    chunk = response.read(1 << 16)
                    if not chunk:
                        break
                    out.write(chunk)
                    received += len(chunk)
                    if received > MAX_DOWNLOAD_BYTES:
                        raise DataError(f"the download passed the {MAX_DOWNLOAD_BYTES:,}-byte limit; this is not the "
                                        "WikiText archive")
                    bar.update(len(chunk))
            if total is not None and received < total:
                raise _Retryable(f"truncated body: {received} of {total} bytes")
    except urllib.error.HTTPError as exc:
        if exc.code >= 500 or exc.code == 429:
            raise _Retryable(f"HTTP {exc.code}") from None
        raise DataError(f"HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError, http.client.IncompleteRead) as exc:
        reason = getattr(exc, "reason", exc)
        raise _Retryable(f"{type(exc).__name__}: {reason}") from None


def download(cfg: DataConfig, release: Release, scratch: Path) -> tuple[str, Path]:
    """Try each mirror with bounded retries; return (url, verified archive path) or raise with every failure."""
    failures = []
    for url in cfg.mirrors:
        for attempt in range(1, cfg.attempts + 1):
            dest = scratch / "download.zip"
            try:
                _download_once(url, dest, cfg.timeout_s)
                verify_archive(dest, release)
                return url, dest
            except _Retryable as exc:
                failures.append(f"{url} (attempt {attempt}/{cfg.attempts}): {exc}")
                if attempt < cfg.attempts:
                    time.sleep(cfg.retry_backoff_s * attempt)
            except DataError as exc:  # permanent for this mirror: 403/404, wrong hash
                failures.append(f"{url}: {exc}")
                break
    tried = "\n  ".join(failures) if failures else "(data.mirrors is empty)"
    raise DataError(
        "could not download WikiText-2 from any mirror:\n  " + tried + "\n"
        "Either point the pipeline at a copy you already have (dvc exp run -S data.path=/abs/wikitext-2-raw-v1.zip, "
        "or -S data=local -S data.path=/abs/dir for your own corpus), or run with network access to a mirror."
    )


# ---------------------------------------------------------------- the stage

def fetch(cfg: DataConfig, out_dir: str | Path, release: Release = WIKITEXT2_RAW) -> dict:
    """Populate out_dir with the three raw splits and manifest.json; nothing is written unless all checks pass."""
    out_dir = Path(out_dir)
    archive_info = None
    verified = cfg.source == "wikitext2"
    with tempfile.TemporaryDirectory(prefix=".fetch.", dir=_existing_parent(out_dir)) as scratch:
        if cfg.path:
            path = Path(cfg.path).expanduser()
            origin = str(path)
            if verified and path.is_file():
                verify_archive(path, release)
            files = read_local(path)
            if path.is_file():
                archive_info = {"file": str(path), "bytes": path.stat().st_size, "sha256": sha256_file(path)}
        elif cfg.source == "local":
            raise DataError("data.path is required with data=local (a directory or zip of wiki.*.raw files).")
        else:
            origin, archive = download(cfg, release, Path(scratch))
            archive_info = {"url": origin, "bytes": archive.stat().st_size, "sha256": sha256_file(archive)}
            files = read_zip(archive)
        if verified:
            verify_members(files, release, origin)
        characters = check_text(files, origin)
        manifest = {
            "source": cfg.source,
            "origin": origin,
            "verified_against": release.name if verified else None,
            "archive": archive_info,
            "files": {
                split: {
                    "file": name,
                    "bytes": len(files[name]),
                    "characters": characters[name],
                    "sha256": sha256_bytes(files[name]),
                }
                for split, name in SPLIT_FILES.items()
            },
        }
        with atomic_directory(out_dir) as tmp:
            for name, data in files.items():
                (tmp / name).write_bytes(data)
            atomic_write_json(tmp / MANIFEST_NAME, manifest)
    return manifest


def _existing_parent(out_dir: Path) -> Path:
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    return out_dir.parent
