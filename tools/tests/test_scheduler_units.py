"""Pieces of the device scheduler: declarations, inventory, environment hygiene, process tags."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from rich.console import Console

from tools.gpu_scheduler import (
    CollectError,
    FileStatus,
    InventoryError,
    SchedulerOptions,
    TestFile,
    collect,
    declared_devices,
    detect_devices,
    exit_code,
    parse_devices,
    run_files,
)
from tools.gpu_scheduler.collect import find_test_files
from tools.gpu_scheduler.environment import (
    REPO_ROOT,
    base_environ,
    filesystem_type,
    is_network_filesystem,
    job_environ,
    local_temp_root,
)
from tools.gpu_scheduler.processes import TAG_VARIABLE, add_tag, is_alive, job_processes, signal_job
from tools.gpu_scheduler.scheduler import FileResult, main


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize(("source", "need"), [
    ("import pytest\npytestmark = pytest.mark.devices(2)\n", 2),
    ("import pytest\npytestmark = [pytest.mark.slow, pytest.mark.devices(4)]\n", 4),
    ("DEVICES = 3\n", 3),
    ("DEVICES: int = 1\n", 1),
    ("from pytest import mark\n@mark.devices(2)\ndef test_a(): pass\n", 2),
    ("import pytest\nclass TestX:\n    @pytest.mark.devices(1)\n    def test_a(self): pass\n"
     "@pytest.mark.devices(8)\ndef test_b(): pass\n", 8),  # the file needs its largest test
    ("import pytest\n@pytest.mark.parametrize('x', [pytest.param(1, marks="
     "pytest.mark.devices(2))])\ndef test_a(x): pass\n", 2),
    ("DEVICES = 1\nimport pytest\npytestmark = pytest.mark.devices(2)\n", 2),
    ("import pytest\npytestmark = pytest.mark.gpu\ndef helper(DEVICES=4): pass\n", None),
])
def test_declared_devices(tmp_path, source, need):
    assert declared_devices(write(tmp_path / "test_x.py", source)) == need


@pytest.mark.parametrize("source", [
    "import pytest\npytestmark = pytest.mark.devices(n)\n",
    "import pytest\npytestmark = pytest.mark.devices(-1)\n",
    "import pytest\npytestmark = pytest.mark.devices(count=2)\n",
    "DEVICES = '2'\n",
])
def test_bad_declarations_name_the_file_and_line(tmp_path, source):
    path = write(tmp_path / "test_bad.py", source)
    with pytest.raises(CollectError, match=r"test_bad\.py:\d"):
        declared_devices(path)


def test_collect_walks_directories_and_keeps_defaults(tmp_path):
    write(tmp_path / "a" / "test_one.py", "DEVICES = 2\n")
    write(tmp_path / "a" / "two_test.py", "x = 1\n")
    write(tmp_path / "a" / "helper.py", "DEVICES = 8\n")
    write(tmp_path / "a" / ".venv" / "test_vendored.py", "")
    write(tmp_path / "a" / "__pycache__" / "test_cached.py", "")
    write(tmp_path / "a" / "test_broken.py", "def (:\n")  # its own pytest run reports this
    files = collect([tmp_path / "a", tmp_path / "a" / "test_one.py"], default_devices=0)
    assert [(f.path.name, f.devices, f.declared) for f in files] == [
        ("test_broken.py", 0, False), ("test_one.py", 2, True), ("two_test.py", 0, False)]
    with pytest.raises(CollectError, match="no such test file"):
        find_test_files([tmp_path / "missing"])


@pytest.mark.parametrize(("spec", "ids"), [
    ("4", ["0", "1", "2", "3"]), ("0,2", ["0", "2"]), ("3,", ["3"]), ("", []), ("0", []),
    (" 1 , 5 ", ["1", "5"]), ("GPU-0a1b", ["GPU-0a1b"]),
])
def test_parse_devices(spec, ids):
    assert parse_devices(spec) == ids


@pytest.mark.parametrize("spec", ["-1", "0,,1", "1,1", ","])
def test_parse_devices_rejects(spec):
    with pytest.raises(InventoryError):
        parse_devices(spec)


def test_visible_devices_are_the_inventory():
    assert detect_devices({"CUDA_VISIBLE_DEVICES": "2,3"}) == ["2", "3"]
    assert detect_devices({"CUDA_VISIBLE_DEVICES": ""}) == []


MOUNTS = """\
/dev/sda1 / ext4 rw 0 0
tmpfs {root}/local tmpfs rw 0 0
server:/export {root}/remote nfs4 rw,vers=4.2 0 0
server:/home {root}/remote/with\\040space cifs rw 0 0
"""


def test_network_filesystems_are_recognised(tmp_path):
    root = os.path.realpath(tmp_path)
    mounts = MOUNTS.format(root=root)
    for d in ("local", "remote/sub", "remote/with space"):
        (tmp_path / d).mkdir(parents=True)
    assert filesystem_type(tmp_path / "local", mounts) == "tmpfs"
    assert filesystem_type(tmp_path / "remote" / "sub", mounts) == "nfs4"
    assert filesystem_type(tmp_path / "remote" / "with space", mounts) == "cifs"
    assert filesystem_type(tmp_path / "remotex", mounts) == "ext4"  # a prefix, not a parent
    assert is_network_filesystem(tmp_path / "remote", mounts)
    assert not is_network_filesystem(tmp_path / "local", mounts)
    # Ray's temp dir goes to the first candidate that is local and writable.
    assert local_temp_root([tmp_path / "remote" / "sub", tmp_path / "missing",
                            tmp_path / "local"], mounts) == tmp_path / "local"
    with pytest.raises(OSError, match="nfs4"):
        local_temp_root([tmp_path / "remote"], mounts)


def test_child_environment_hygiene(tmp_path):
    env, notes = base_environ({"RAY_ADDRESS": "", "PATH": "/bin"}, probe=lambda: False)
    assert "RAY_ADDRESS" not in env and any("RAY_ADDRESS" in n for n in notes)
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "lo"
    routable, _ = base_environ({"PATH": "/bin"}, probe=lambda: True)
    assert "NCCL_SOCKET_IFNAME" not in routable
    kept, _ = base_environ({"NCCL_SOCKET_IFNAME": "ib0"}, probe=lambda: False)
    assert kept["NCCL_SOCKET_IFNAME"] == "ib0"  # a multi-node setting is never overridden
    unguarded, _ = base_environ({}, loopback_guard=False)
    assert "NCCL_SOCKET_IFNAME" not in unguarded
    job = job_environ(env, ["1", "3"], tmp_path)
    assert job["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert job["TMPDIR"] == job["RAY_TMPDIR"] == str(tmp_path)
    assert job_environ(env, [], tmp_path)["CUDA_VISIBLE_DEVICES"] == ""  # no GPU at all
    assert job["PYTHONPATH"].split(os.pathsep)[0] == str(REPO_ROOT)  # the plugin imports


def test_tags_find_processes_that_left_the_group():
    env = {k: v for k, v in os.environ.items() if k != TAG_VARIABLE}  # may run under a scheduler
    add_tag(env, "outer")
    add_tag(env, "inner")
    assert env[TAG_VARIABLE] == "outer:inner"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while child.pid not in job_processes(None, "inner") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert child.pid in job_processes(None, "outer")
        assert child.pid in job_processes(None, "inner")
        assert child.pid not in job_processes(None, "out")
        assert child.pid in job_processes(child.pid, "unrelated")  # its own group
        assert signal_job(None, "inner", signal.SIGKILL) == {child.pid}
        child.wait(timeout=10)
        assert not is_alive(child.pid) and not job_processes(child.pid, "inner")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)


def test_files_that_cannot_fit_are_reported_without_running(tmp_path):
    path = write(tmp_path / "test_big.py", "DEVICES = 8\n")
    out = io.StringIO()
    results, scheduler = run_files([TestFile(path, 8, True)],
                                   SchedulerOptions(devices=("0", "1"), loopback_guard=False),
                                   Console(file=out, width=200))
    assert results[0].status is FileStatus.UNSCHEDULABLE and results[0].start is None
    assert "needs 8 devices, the inventory has 2" in out.getvalue()
    assert exit_code(results, scheduler.interrupted) == 1


def test_exit_codes():
    def result(status):
        return FileResult(Path("test_x.py"), 1, status)

    ok = [result(FileStatus.PASSED), result(FileStatus.NO_TESTS)]
    assert exit_code(ok, False) == 0
    assert exit_code([*ok, result(FileStatus.TIMED_OUT)], False) == 1
    assert exit_code([*ok, result(FileStatus.NOT_STARTED)], False) == 1
    assert exit_code([*ok, result(FileStatus.INTERRUPTED)], False) == 130
    assert exit_code(ok, True) == 130


def test_plugin_registers_the_marker_under_strict_markers(tmp_path):
    write(tmp_path / "test_marked.py", """\
        import pytest
        pytestmark = pytest.mark.devices(2)

        def test_devices(scheduled_devices):
            assert scheduled_devices == ["4", "7"]
        """)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "4,7", "PYTHONPATH": str(REPO_ROOT)}
    cmd = [sys.executable, "-m", "pytest", "-q", "--strict-markers", "-p", "no:cacheprovider",
           "test_marked.py"]
    res = subprocess.run([*cmd, "-p", "tools.gpu_scheduler.plugin"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    bare = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert bare.returncode != 0 and "'devices' not found in `markers`" in bare.stdout


def test_main_reports_bad_input(tmp_path, capsys):
    assert main([str(tmp_path / "nope"), "--devices", "2"]) == 2
    assert "no such test file or directory" in capsys.readouterr().err
    assert main([str(tmp_path), "--devices", "1,1"]) == 2
    assert "repeated id" in capsys.readouterr().err


def test_runs_as_a_module_from_the_repository_root():
    res = subprocess.run([sys.executable, "-m", "tools.gpu_scheduler", "--help"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "python -m tools.gpu_scheduler" in res.stdout
