"""The wheel as a zip: its RECORD (sha256 and size of every file) and the zip itself, written so
that the same files give the same bytes.

Zip entries are in the order given, dated 1980-01-01 (or ``$SOURCE_DATE_EPOCH``, clamped to the
zip range), mode 0644, Unix; ``.zst`` files are STORED, everything else DEFLATED at level 9.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import time
import zipfile
from collections.abc import Mapping

from .wheel_layout import WheelError

#: 1980-01-01 00:00:00, the earliest time a zip entry can hold.
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
FILE_MODE = 0o100644


def zip_date_time() -> tuple[int, int, int, int, int, int]:
    """``$SOURCE_DATE_EPOCH`` as a zip date (UTC, clamped to 1980..2107), else 1980-01-01."""
    env = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if not env:
        return ZIP_EPOCH
    try:
        epoch = int(env)
    except ValueError:
        raise WheelError(f"SOURCE_DATE_EPOCH={env!r} is not an integer number of seconds") from None
    t = time.gmtime(min(max(epoch, 315532800), 4354819198))  # 1980-01-01 .. 2107-12-31
    return (t.tm_year, t.tm_mon, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec - t.tm_sec % 2)


def record_hash(data: bytes) -> str:
    """A RECORD line's hash: ``sha256=`` and the digest in urlsafe base64, unpadded."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def record_file(files: Mapping[str, bytes], record_name: str) -> bytes:
    """The RECORD of ``files`` (in their order), its own line last and without a hash."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    for name in files:
        w.writerow([name, record_hash(files[name]), len(files[name])])
    w.writerow([record_name, "", ""])
    return buf.getvalue().encode()


def parse_record(text: str) -> dict[str, tuple[str, str]]:
    """A RECORD's lines: file name -> (hash, size), each as written."""
    out = {}
    for row in csv.reader(io.StringIO(text)):
        if row:
            out[row[0]] = (row[1] if len(row) > 1 else "", row[2] if len(row) > 2 else "")
    return out


def zip_bytes(files: Mapping[str, bytes]) -> bytes:
    """A zip of ``files`` in the given order; identical input -> identical bytes."""
    date_time = zip_date_time()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in files.items():
            zi = zipfile.ZipInfo(name, date_time=date_time)
            zi.create_system = 3  # Unix, whatever the host
            zi.external_attr = FILE_MODE << 16
            # A .zst file is one zstd frame: deflate gains nothing. The pack is stored deflated:
            # its 424 blob files each repeat a 44-byte dictionary reference and zstd frame
            # headers, which deflate takes out (88.8 -> 52.6 KB for the reference manifest);
            # pip inflates it on install, so the runtime reads the same pack bytes.
            if name.endswith(".zst"):
                zi.compress_type = zipfile.ZIP_STORED
                zf.writestr(zi, data)
            else:
                zi.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(zi, data, compresslevel=9)
    return buf.getvalue()
