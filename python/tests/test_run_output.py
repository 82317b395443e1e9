"""`kdt run -o OUT` ($KDT_BIN) writes atomically and only where it may: a new path or a writable
regular file is replaced through a uniquely named temporary in the same folder; a symlink has its
target replaced (the link stays); a device, FIFO, socket, folder, read-only file or dangling link is
refused with one line naming OUT and left untouched; no temporary survives a failure, and a stale
OUT.tmp is never written through.
"""
import os
import resource
import signal
import socket
import stat
import subprocess

import numpy as np
import pytest

import kdtr

BIN = os.environ.get("KDT_BIN", "")
pytestmark = pytest.mark.skipif(not BIN or not os.path.exists(BIN), reason="KDT_BIN (the kdt binary) not built")


@pytest.fixture
def work(tmp_path):
    """A folder with a tree_accept input: root -> 1 -> 2, the target agrees with both drafts."""
    kdtr.save(tmp_path / "in.kdtr", {
        "node_token": np.array([[5, 7, 9]], np.int32), "node_parent": np.array([[-1, 0, 1]], np.int32),
        "num_nodes": np.array([2], np.int32), "target_pred": np.array([[7, 9, 3]], np.int32)})
    return tmp_path


def run(work, out, **kw):
    return subprocess.run([BIN, "run", "tree_accept", str(work / "in.kdtr"), "-o", str(out), "--backend", "cpu"],
                          capture_output=True, text=True, timeout=60, **kw)


def assert_written(path):
    t = kdtr.load(path)
    assert list(t["accept_tokens"][0][:3]) == [7, 9, 3] and int(t["accept_len"][0]) == 2


def listing(folder):
    return sorted(os.listdir(folder))


def assert_refused(work, out, what):
    before = listing(work)
    r = run(work, out)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(out) in lines[0] and what in lines[0], r.stderr
    assert listing(work) == before  # no temporary left, nothing replaced


def test_new_path_and_regular_file(work):
    out = work / "out.kdtr"
    r = run(work, out)
    assert r.returncode == 0, r.stderr
    assert_written(out)
    out.write_bytes(b"old contents")
    os.chmod(out, 0o640)
    assert run(work, out).returncode == 0
    assert_written(out)
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o640  # the replaced file keeps its mode
    assert listing(work) == ["in.kdtr", "out.kdtr"]


def test_stale_tmp_is_not_used(work):
    out = work / "out.kdtr"
    stale = work / "out.kdtr.tmp"
    stale.write_bytes(b"someone else's")
    assert run(work, out).returncode == 0
    assert_written(out)
    assert stale.read_bytes() == b"someone else's"


def test_symlink_writes_its_target(work):
    target = work / "target.kdtr"
    target.write_bytes(b"old")
    link = work / "link.kdtr"
    os.symlink("target.kdtr", link)
    assert run(work, link).returncode == 0, "symlink to a regular file"
    assert os.path.islink(link) and os.readlink(link) == "target.kdtr"
    assert_written(target)


def test_dangling_symlink_refused(work):
    os.symlink("missing.kdtr", work / "dangling.kdtr")
    assert_refused(work, work / "dangling.kdtr", "symlink to a missing file")


def test_symlink_to_folder_refused(work):
    (work / "d").mkdir()
    os.symlink("d", work / "to_dir.kdtr")
    assert_refused(work, work / "to_dir.kdtr", "a directory")


def test_directory_refused(work):
    (work / "d.kdtr").mkdir()
    assert_refused(work, work / "d.kdtr", "a directory")
    assert listing(work / "d.kdtr") == []


def test_fifo_refused(work):
    os.mkfifo(work / "fifo.kdtr")
    assert_refused(work, work / "fifo.kdtr", "a FIFO")
    assert stat.S_ISFIFO(os.lstat(work / "fifo.kdtr").st_mode)


def test_socket_refused(work):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(work / "sock.kdtr"))
        assert_refused(work, work / "sock.kdtr", "a socket")
    finally:
        s.close()


def test_character_device_refused(work):
    """A node like /dev/full, made in the test folder so that a regression cannot harm /dev."""
    dev = work / "full.kdtr"
    try:
        os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    except PermissionError:
        pytest.skip("making a device node needs root (CAP_MKNOD)")
    assert_refused(work, dev, "a character device")
    assert stat.S_ISCHR(os.lstat(dev).st_mode)


def test_read_only_refused(work):
    """Refused even as root: the mode bits are honoured, not the privilege."""
    ro = work / "ro.kdtr"
    ro.write_bytes(b"keep me")
    os.chmod(ro, 0o444)
    assert_refused(work, ro, "read-only")
    assert ro.read_bytes() == b"keep me"


def test_failed_write_removes_temporary(work):
    """A write that fails half way (file size limit) leaves OUT as it was and no temporary."""
    out = work / "out.kdtr"
    out.write_bytes(b"old contents")

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))
    before = listing(work)
    r = run(work, out, preexec_fn=limit)
    assert r.returncode == 1 and str(out) in r.stderr, r.stderr
    assert listing(work) == before
    assert out.read_bytes() == b"old contents"
