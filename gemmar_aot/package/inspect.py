"""Reading an artifact wheel back and checking it (``gemmar-aot inspect``): what it holds, and
whether every byte is the one it was built with.

:func:`inspect_wheel` goes in steps: the zip's files (:class:`WheelFiles`), each against RECORD,
the package and its BUILD_INFO.json, the lock and the manifest text against what BUILD_INFO.json
records, every blob the lock names against the pack (:class:`PackTally`), the record index
against the lock, and the signature. A wheel that is no artifact wheel at all is a
:class:`~gemmar_aot.package.wheel_layout.WheelError`; anything else that does not match is a finding in
the report's ``problems``.
"""

from __future__ import annotations

import json
import os
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path, PurePosixPath
from typing import Any

from gemmar_aot.util.errors import GemmarError
from gemmar_aot.model.lock import Lock
from gemmar_aot.model.schema import LockSchemaError
from gemmar_aot.store.store_errors import BlobNotFoundError, StoreError
from gemmar_aot.store.pack import PREFIX_HEX, PackBackend
from gemmar_aot.store.record_index import RecordIndex, RecordIndexError
from gemmar_aot.model.bundle import LockBundle

from .archive import parse_record, record_hash
from .wheel_layout import (ENVELOPE_ARCNAME, OLD_LOCK_ARCNAME, PACK_ARCPATH, READ_WHEEL_FORMATS, WheelError,
                           build_info_digest, coverage, lock_sizes)
from gemmar_aot.util.filedigest import sha256_hex


def inspect_wheel(path: str | os.PathLike, trusted_keys: Any = None) -> dict:
    """What an artifact wheel holds, and whether it is intact.

    ``signature``: who signed the lock and the provenance they signed (None: unsigned); with
    ``trusted_keys`` (:func:`gemmar_aot.trust.trust_set.load_trust`) also whether it verifies against them,
    ``verified``, a failure being a problem like any other.

    Checks every file against RECORD (sha256 and size; files missing from either side),
    the lock against BUILD_INFO, the manifest text against its sha256, decodes every
    blob the lock names against its digest, and checks every line of the record index
    against the record digest the lock names. ``ok`` is False and ``problems`` lists each
    finding when anything does not match. A lock of another schema (an older or a newer
    gemmar-aot built the wheel) is no finding: ``other_schema`` says why its kernels could not
    be checked, and ``ok`` is False.
    """
    path = Path(path)
    files = _read_wheel(path)
    checked, problems = _check_record(files)
    pkg, info = _artifact_package(path, files)
    if info.get("format") not in READ_WHEEL_FORMATS:
        problems.append(f"{pkg}/BUILD_INFO.json is of wheel format {info.get('format')!r}; this gemmar-aot reads "
                        f"{', '.join(map(str, READ_WHEEL_FORMATS))}: inspect it with the gemmar-aot that made it")
    lock_name, lock, other_schema = _read_lock(files.contents, pkg, info, problems)
    problems += _manifest_problems(info, lock)
    pack_name, pack = _open_pack(files.contents, pkg, problems)
    tally = PackTally()
    if lock is not None:
        tally = _check_blobs(lock, pack, pack_name, problems)
        problems += _index_problems(lock, lock_name, info, files.contents, pkg)
    signature = _signature(files.contents, pkg, lock is not None or other_schema is not None, lock_name,
                           trusted_keys, problems)
    return _report(path, files, pkg, info, problems, checked, tally, signature, other_schema)


@dataclass(frozen=True)
class WheelFiles:
    """The files of a wheel (directories left out, each name once, in the zip's order), the bytes
    of each that could be read, and a finding for each that could not."""

    dist_info: str
    members: tuple[str, ...]
    contents: Mapping[str, bytes]
    unreadable: tuple[str, ...]

    @property
    def record_name(self) -> str:
        return f"{self.dist_info}/RECORD"


def _read_wheel(path: Path) -> WheelFiles:
    """Every file of the zip at ``path``; not a zip, no one .dist-info or no RECORD is a WheelError."""
    try:
        zf = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise WheelError(f"{path} is not a wheel (zip): {e}") from None
    with zf:
        members = tuple(dict.fromkeys(zi.filename for zi in zf.infolist() if not zi.is_dir()))
        dist_infos = sorted({PurePosixPath(n).parts[0] for n in members
                             if PurePosixPath(n).parts[0].endswith(".dist-info")})
        if len(dist_infos) != 1:
            raise WheelError(f"{path}: expected one .dist-info directory, found {dist_infos or 'none'}")
        if f"{dist_infos[0]}/RECORD" not in members:
            raise WheelError(f"{path}: no {dist_infos[0]}/RECORD")
        contents: dict[str, bytes] = {}
        unreadable: list[str] = []
        for n in members:
            try:
                contents[n] = zf.read(n)
            except (zipfile.BadZipFile, zlib.error) as e:  # a CRC mismatch: bytes changed in place
                unreadable.append(f"{n}: unreadable ({e})")
    return WheelFiles(dist_infos[0], members, contents, tuple(unreadable))


def _check_record(files: WheelFiles) -> tuple[int, list[str]]:
    """(files checked, findings): each file against its RECORD line, and each line against a file;
    the findings start with the files that could not be read."""
    problems = list(files.unreadable)
    record = parse_record(files.contents.get(files.record_name, b"").decode("utf-8", errors="replace"))
    checked = 0
    for n in sorted(files.members):
        if n == files.record_name or n not in files.contents:
            continue
        if n not in record:
            problems.append(f"{n}: not listed in RECORD (added after the wheel was built)")
            continue
        want_hash, want_size = record[n]
        got_hash = record_hash(files.contents[n])
        if want_hash != got_hash or str(len(files.contents[n])) != want_size:
            problems.append(f"{n}: RECORD says {want_hash} ({want_size} bytes), the file is {got_hash} "
                            f"({len(files.contents[n])} bytes): modified after the wheel was built")
        checked += 1
    for n in sorted(record):
        if n != files.record_name and n not in files.members:
            problems.append(f"{n}: listed in RECORD but missing from the wheel")
    return checked, problems


def _artifact_package(path: Path, files: WheelFiles) -> tuple[str, dict]:
    """The import package holding BUILD_INFO.json, and BUILD_INFO.json; a WheelError when there is
    not exactly one, or it does not parse."""
    pkgs = sorted({PurePosixPath(n).parts[0] for n in files.members
                   if n.endswith("/BUILD_INFO.json") and len(PurePosixPath(n).parts) == 2})
    if len(pkgs) != 1:
        raise WheelError(f"{path} is not a gemmar-aot artifact wheel (no <package>/BUILD_INFO.json)")
    pkg = pkgs[0]
    try:
        info = json.loads(files.contents[f"{pkg}/BUILD_INFO.json"])
    except (KeyError, ValueError) as e:
        raise WheelError(f"{path}: {pkg}/BUILD_INFO.json is unreadable: {e}") from None
    return pkg, info


def _read_lock(contents: Mapping[str, bytes], pkg: str, info: Mapping[str, Any],
               problems: list[str]) -> tuple[str, Lock | None, str | None]:
    """The lock's name in the wheel, the lock (None when missing or unreadable: a finding), checked
    against the sha256 BUILD_INFO.json records, and why this gemmar-aot cannot read it when it is
    of another lock schema (not a finding: an older or newer gemmar-aot wrote it; None otherwise)."""
    lock_name = f"{pkg}/{(info.get('lock') or {}).get('file') or OLD_LOCK_ARCNAME}"
    lock_file = contents.get(lock_name)
    if lock_file is None:
        problems.append(f"{lock_name} is missing")
        return lock_name, None, None
    from gemmar_aot.model.lock_codec import plain_lock_bytes

    lock = other_schema = None
    try:
        lock = Lock.from_bytes(lock_file, lock_name).check_parts()
        plain = lock.to_bytes()
    except LockSchemaError as e:  # another gemmar-aot's lock: its bytes are still checked
        other_schema, plain = str(e), plain_lock_bytes(lock_file, lock_name)
    except GemmarError as e:
        problems.append(str(e))
    if (lock is not None or other_schema) and sha256_hex(plain) != build_info_digest(info, "lock"):
        problems.append(f"{lock_name} does not have the sha256 BUILD_INFO.json records")
    return lock_name, lock, other_schema


def _manifest_problems(info: Mapping[str, Any], lock: Lock | None) -> list[str]:
    """BUILD_INFO.json's manifest text against its sha256, and that sha256 against the lock's."""
    man = info.get("manifest") or {}
    out = []
    sha = build_info_digest(info, "manifest")
    if sha256_hex(man.get("text", "").encode()) != sha:
        out.append("BUILD_INFO.json's manifest text does not match its sha256")
    if lock is not None and lock.manifest.sha256 != sha:
        out.append("the lock was built from another manifest than the one BUILD_INFO.json records")
    return out


def _open_pack(contents: Mapping[str, bytes], pkg: str, problems: list[str]) -> tuple[str, PackBackend | None]:
    """The pack's name in the wheel and the pack (None when missing or its index is bad: a finding)."""
    pack_name = f"{pkg}/{PACK_ARCPATH}"
    if pack_name not in contents:
        problems.append(f"{pack_name} is missing")
        return pack_name, None
    try:
        return pack_name, PackBackend(".", data=contents[pack_name], where=pack_name)
    except StoreError as e:
        problems.append(str(e))
        return pack_name, None


@dataclass(frozen=True)
class PackTally:
    """What the pack holds for the lock: bytes decoded, stored and of the dictionary, the lock's
    kernels and code objects, and the tuples it covers (all zero without a readable lock)."""

    raw_bytes: int = 0
    blob_bytes: int = 0
    dictionary_bytes: int = 0
    kernels: int = 0
    code_objects: int = 0
    coverage: list[dict] = field(default_factory=list)


def _check_blobs(lock: Lock, pack: PackBackend | None, pack_name: str, problems: list[str]) -> PackTally:
    """Every blob the lock names, decoded from the pack against its digest and size, and every
    pack entry named by the lock (a blob or its dictionary); each mismatch a finding."""
    sizes = lock_sizes(lock)
    raw_bytes = blob_bytes = dict_bytes = 0
    for d, size in sorted(sizes.items()):
        try:
            if pack is None:
                raise BlobNotFoundError(d, Path(pack_name))
            raw_bytes += len(pack.load_blob(d, size))
        except StoreError as e:
            problems.append(f"{pack_name}: blob {d}: {e}")
            raw_bytes += size or 0
    if pack is not None:
        dicts = pack.dictionary_refs()
        blob_bytes = sum(pack.stored_bytes(d) for d in sizes)
        dict_bytes = sum(pack.stored_bytes(d) for d in dicts)
        named = {d[:PREFIX_HEX] for d in set(sizes) | dicts}
        for prefix in pack.prefixes():
            if prefix not in named:
                problems.append(f"{pack_name}: an entry ({prefix}...) for a blob the lock does not name")
    return PackTally(raw_bytes, blob_bytes, dict_bytes, len(lock.action_keys()), len(sizes), coverage(lock))


def _index_problems(lock: Lock, lock_name: str, info: Mapping[str, Any], contents: Mapping[str, bytes],
                    pkg: str) -> list[str]:
    """What is wrong with the wheel's record index: every line must be its lock's record."""
    name = f"{pkg}/{LockBundle(lock_name).record_index.name}"
    data = contents.get(name)
    if data is None:
        return [f"{name} is missing (BUILD_INFO.json lists it)"] if info.get("record_index") else []
    try:
        index = RecordIndex.from_bytes(data, Path(name))
    except RecordIndexError as e:
        return [str(e)]
    kernels = lock.kernels()
    got = index.records((k, e.record, e.blob.hash) for k, e in kernels.items())
    out = []
    for key, rec in sorted(got.items()):
        if not isinstance(rec, dict):
            out.append(f"{name}: " + (f"no record for action key {key}" if rec is None else
                                      f"the record of action key {key} is {rec.hash}, the lock names "
                                      f"{kernels[key].record.hash}"))
    return out


def _signature(contents: Mapping[str, bytes], pkg: str, lock_read: bool, lock_name: str, trusted_keys: Any,
               problems: list[str]) -> dict | None:
    """The wheel's envelope, read (and verified against ``trusted_keys`` when given) over the lock's
    bytes when they could be read (``lock_read``: a lock of another schema too); a finding goes to
    ``problems``."""
    from gemmar_aot.model.lock_codec import plain_lock_bytes
    from gemmar_aot.trust.trust_set import describe_signature, trust_from

    if not lock_read:
        return None
    name = f"{pkg}/{ENVELOPE_ARCNAME}"
    trust = trust_from(trusted_keys) if trusted_keys is not None else None
    # the bytes the wheel ships, as a pod reads them (never a re-serialisation of what was parsed)
    out, problem = describe_signature(contents.get(name), plain_lock_bytes(contents[lock_name], lock_name),
                                      lock_name, name, trust)
    if problem:
        problems.append(problem)
    return out


def _report(path: Path, files: WheelFiles, pkg: str, info: Mapping[str, Any], problems: list[str], checked: int,
            tally: PackTally, signature: dict | None, other_schema: str | None) -> dict:
    """What :func:`inspect_wheel` returns (``gemmar-aot inspect --json``): ``ok`` only when every
    check ran and passed; ``other_schema`` (not a problem) when the lock is of a schema this
    gemmar-aot does not read, so its kernels were not checked."""
    di = files.dist_info
    meta = HeaderParser().parsestr(files.contents.get(f"{di}/METADATA", b"").decode("utf-8", errors="replace"))
    wheel_meta = HeaderParser().parsestr(files.contents.get(f"{di}/WHEEL", b"").decode("utf-8", errors="replace"))
    eps = files.contents.get(f"{di}/entry_points.txt", b"").decode("utf-8", errors="replace")
    man = info.get("manifest") or {}
    return {
        "wheel": str(path),
        "ok": not problems and other_schema is None,
        "problems": problems,
        "other_schema": other_schema,
        "files_checked": checked,
        "distribution": meta.get("Name"),
        "version": meta.get("Version"),
        "requires_dist": meta.get_all("Requires-Dist") or [],
        "tag": wheel_meta.get("Tag"),
        "package": pkg,
        "entry_points": [ln.strip() for ln in eps.splitlines() if "=" in ln],
        "arch": info.get("arch"),
        "code_object_version": info.get("code_object_version"),
        "toolchain": info.get("toolchain"),
        "manifest": {"name": man.get("name"), "file": man.get("file"), "sha256": build_info_digest(info, "manifest"),
                     "text": man.get("text")},
        "generator": info.get("generator"),
        "coverage": tally.coverage,
        "kernels": tally.kernels,
        "code_objects": tally.code_objects,
        "sizes": {
            "wheel_bytes": path.stat().st_size,
            "blob_bytes": tally.blob_bytes,
            "dictionary_file_bytes": tally.dictionary_bytes,
            "raw_bytes": tally.raw_bytes,
        },
        "encoding": info.get("encoding"),
        "signature": signature,
    }
